import { defineBoxTransition } from './boxTransition';
import type { BoxRestorePayload } from './boxJobs';
import { JobRefused } from './types';

const refusal = (box: string, snapshot: string, blockers: { snapshots: string[]; forks: string[] }) => {
  const names = [...blockers.snapshots.map((n) => `snapshot ${n}`), ...(blockers.forks.length ? [`${blockers.forks.length} fork(s)`] : [])];
  return names.length ? `cannot restore box ${box} to ${snapshot}: ${names.join(', ')} made after it would be lost` : null;
};

/**
 * running|stopped → restoring → running: the container stops, the root rolls back to the
 * snapshot, the box starts with the snapshot's files. Refused, with the box left as it was
 * (`from`), while later snapshots or forks depend on what the rollback would destroy: the api
 * checked before queueing; this is the check at the job's turn, before anything stops. One that
 * appears between that check and the rollback (a fork made meanwhile) is caught by the rollback
 * itself, which refuses before changing anything: a box that was running is started again.
 */
export const restoreBoxJob = defineBoxTransition<BoxRestorePayload>(
  'restore',
  async (node, box, { snapshot, from }) => {
    try {
      await node.restore(box, snapshot);
    } catch (e) {
      if ((e as Error).name !== 'StorageInUseError') throw e;
      if (from !== 'stopped') await node.start(box);
      throw new JobRefused(`cannot restore box ${box.name} to ${snapshot}: snapshots or forks were made after it meanwhile; nothing was changed`, from ?? 'running');
    }
  },
  async (node, box, { snapshot, from }) => {
    const leave = from ?? (box.status === 'stopped' ? 'stopped' : 'running');
    let blockers;
    try {
      blockers = await node.restoreBlockers(box, snapshot);
    } catch (e) {
      if (/has no snapshot/.test((e as Error).message)) throw new JobRefused(`box ${box.name} has no snapshot ${snapshot}`, leave);
      throw e;
    }
    const why = refusal(box.name, snapshot, blockers);
    if (why) {
      // A retry may find the container stopped by the attempt before: a box that ran runs again
      // (start is idempotent: a running one is left as it is).
      if (box.status === 'restoring' && leave === 'running') await node.start(box);
      throw new JobRefused(why, leave);
    }
  },
);
