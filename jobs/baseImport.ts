import { basesRepo } from '../db/repos/bases';
import { baseJobs } from './baseJobs';
import { defineJob, JobRefused } from './types';

/**
 * An upload the node staged (and scanned) unpacked into a new base, through the import rules
 * again (docs/bases.md), then the upload removed. Idempotent: a retry of a half-made base
 * starts it again from the upload. Failed for good: the upload, the half-made base and the
 * `making` record go.
 */
export const importBaseJob = defineJob({
  type: baseJobs.import,
  async run({ payload, db, bases }) {
    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (!row) throw new JobRefused(`base ${payload.name}@${payload.version} was deleted before it was imported`);
    if (row.state !== 'ready') {
      const size = await bases.importStaged(payload.token, payload);
      await basesRepo.markReady(db, payload.name, payload.version, size);
    }
    await bases.discardStaged(payload.token);
  },
  async onFailed({ payload, db, bases }) {
    await bases.discardStaged(payload.token);
    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (row?.state === 'making') {
      try {
        await bases.destroy(payload);
      } finally {
        await basesRepo.dropMaking(db, payload.name, payload.version);
      }
    }
  },
});
