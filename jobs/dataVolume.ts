import { volumesRepo } from '../db/repos/volumes';
import { dataJobs } from './dataJobs';
import { defineJob, JobRefused } from './types';

/**
 * The short data volume jobs (docs/data.md), each idempotent: create (the dataset with its
 * quota; failed for good, the half-made dataset and the `creating` row go), delete (dataset,
 * snapshots and backups, then the row), snapshot and snapshot delete.
 */
export const createDataJob = defineJob({
  type: dataJobs.create,
  async run({ payload, db, volumes }) {
    const row = await volumesRepo.byId(db, payload.volumeId);
    if (!row) throw new JobRefused('the volume was deleted before it was made');
    await volumes.create(payload.volumeId, payload.quotaGb);
    await volumesRepo.update(db, row.id, { state: 'ready', size_bytes: await volumes.usedBytes(row.id) });
  },
  async onFailed({ payload, db, volumes }) {
    const row = await volumesRepo.byId(db, payload.volumeId);
    if (row?.state !== 'creating') return;
    try {
      await volumes.destroy(payload.volumeId);
    } finally {
      await volumesRepo.remove(db, payload.volumeId);
    }
  },
});

export const deleteDataJob = defineJob({
  type: dataJobs.delete,
  async run({ payload, db, volumes }) {
    await volumes.destroy(payload.volumeId);
    await volumesRepo.remove(db, payload.volumeId);
  },
  async onFailed({ payload, db }) {
    // Still there (storage failed): usable again, and the delete can be asked again.
    if (await volumesRepo.byId(db, payload.volumeId)) await volumesRepo.update(db, payload.volumeId, { state: 'ready' });
  },
});

export const snapshotDataJob = defineJob({
  type: dataJobs.snapshot,
  async run({ payload, db, volumes }) {
    const vol = await volumesRepo.byId(db, payload.volumeId);
    if (!vol) throw new JobRefused('the volume was deleted before its snapshot');
    if (vol.node !== volumes.nodeId) throw new JobRefused(`the volume moved to node ${vol.node} before its snapshot`);
    await volumes.snapshot(payload.volumeId, payload.name, payload.description);
    await volumesRepo.update(db, payload.volumeId, { size_bytes: await volumes.usedBytes(payload.volumeId) });
  },
});

export const deleteDataSnapshotJob = defineJob({
  type: dataJobs.deleteSnapshot,
  async run({ payload, db, volumes }) {
    const vol = await volumesRepo.byId(db, payload.volumeId);
    if (!vol) return;
    if (vol.node !== volumes.nodeId) throw new JobRefused(`the volume moved to node ${vol.node}: its snapshots stayed behind`);
    await volumes.deleteSnapshot(payload.volumeId, payload.name);
  },
});
