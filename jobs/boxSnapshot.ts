import { boxesRepo } from '../db/repos/boxes';
import { canSnapshot } from '../core/box';
import { boxSnapshotJob } from './boxJobs';
import { defineJob, JobRefused } from './types';

/**
 * A snapshot of a box's root, in turn with the box's other operations: a running box is paused
 * for the instant of the snapshot (consistent files) and resumed even when it fails. The box's
 * status does not change. Idempotent: a retry finds the snapshot made and resumes the box.
 */
export const snapshotBoxJob = defineJob({
  type: boxSnapshotJob,
  async run({ payload, db, node }) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) throw new JobRefused('the box was deleted before its snapshot');
    if (!canSnapshot(box.status)) throw new JobRefused(`box ${box.name} is ${box.status}; it can be snapshotted when running or stopped`);
    await node.snapshot(box, payload.name, payload.description);
  },
});
