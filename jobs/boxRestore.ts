import { defineBoxTransition } from './boxTransition';
import type { BoxRestorePayload } from './boxJobs';
import { JobRefused } from './types';

/**
 * running|stopped → restoring → running: the container stops, the root rolls back to the
 * snapshot, the box starts with the snapshot's files. Refused, with the box left as it was,
 * while later snapshots or forks depend on what the rollback would destroy (the api checked
 * the same before queueing; this is the check at the job's turn).
 */
export const restoreBoxJob = defineBoxTransition<BoxRestorePayload>(
  'restore',
  (node, box, { snapshot }) => node.restore(box, snapshot),
  async (node, box, { snapshot }) => {
    const blockers = await node.restoreBlockers(box, snapshot).catch((e: Error) => {
      throw new JobRefused(/has no snapshot/.test(e.message) ? `box ${box.name} has no snapshot ${snapshot}` : e.message);
    });
    const names = [...blockers.snapshots.map((n) => `snapshot ${n}`), ...(blockers.forks.length ? [`${blockers.forks.length} fork(s)`] : [])];
    if (names.length) throw new JobRefused(`cannot restore box ${box.name} to ${snapshot}: ${names.join(', ')} made after it would be lost`);
  },
);
