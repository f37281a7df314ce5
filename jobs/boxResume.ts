import { BOX_JOB } from './boxJobs';
import { defineBoxTransition } from './boxTransition';
import { startBox } from '../workers/boxMachine';

/** stopped → resuming → running, with the config as it is now (a PUT while stopped applies). */
export const resumeBoxJob = defineBoxTransition({ kind: BOX_JOB.resume, what: 'resume', during: 'resuming', step: startBox, after: 'running' });
