import { BOX_JOB } from './boxJobs';
import { defineBoxTransition } from './boxTransition';
import { stopBox } from '../workers/boxMachine';

/** running → stopping → stopped: SIGTERM, SIGKILL after the grace period; the root is kept. */
export const stopBoxJob = defineBoxTransition({ kind: BOX_JOB.stop, what: 'stop', during: 'stopping', step: stopBox, after: 'stopped' });
