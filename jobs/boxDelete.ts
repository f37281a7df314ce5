import { BOX_JOB } from './boxJobs';
import { defineBoxTransition } from './boxTransition';
import { destroyBox } from '../workers/boxMachine';

/** deleting → gone: container, network, datasets, then the row. */
export const deleteBoxJob = defineBoxTransition({ kind: BOX_JOB.delete, what: 'delete', during: 'deleting', step: destroyBox, after: 'gone' });
