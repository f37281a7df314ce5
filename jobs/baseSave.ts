import { boxesRepo } from '../db/repos/boxes';
import { basesRepo } from '../db/repos/bases';
import { canSnapshot } from '../core/box';
import { baseJobs } from './baseJobs';
import { defineJob, JobRefused } from './types';

/**
 * A box saved as a base, in turn with the box's other operations: its root held at one instant
 * (a running box paused for it, as for a snapshot), copied into the base with owners moved back
 * to box ids, the hold dropped. The box's status does not change. Idempotent: a retry finds the
 * hold or the base made. Failed for good: the hold, any half-made base and the `making` record go.
 */
export const saveBaseJob = defineJob({
  type: baseJobs.save,
  async run({ payload, db, bases }) {
    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (!row) throw new JobRefused(`base ${payload.name}@${payload.version} was deleted before it was saved`);
    if (row.state === 'ready') return;
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) throw new JobRefused('the box was deleted before it was saved as a base');
    if (!canSnapshot(box.status)) throw new JobRefused(`box ${box.name} is ${box.status}; it can be saved as a base when running or stopped`);
    const size = await bases.saveFromBox(box, payload);
    await basesRepo.markReady(db, payload.name, payload.version, size);
  },
  async onFailed({ payload, db, bases }) {
    try {
      await bases.abandonSave(payload.boxId, payload);
    } finally {
      // A version that never became ready is forgotten even when its cleanup failed (a dataset
      // left behind is the node's to sweep; a `making` row would block its name for good).
      await basesRepo.dropMaking(db, payload.name, payload.version);
    }
  },
});
