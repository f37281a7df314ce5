import { volumesRepo, type BackupRow } from '../db/repos/volumes';
import { publicReason } from './publicReason';
import { dataJobs } from './dataJobs';
import { defineJob, JobRefused } from './types';

/**
 * A backup of a data volume (docs/data.md "Backups"): `pending` → `running` → `completed` or
 * `failed`. The first of a volume is `full`; each next one is `incremental` on the newest
 * completed backup whose snapshot the volume still has (a restore to an older state or a
 * rollback can take it away; then it is full again). Its mode and parent are fixed at its first
 * run, so a retry after a worker died sends the same stream again.
 */
export const backupDataJob = defineJob({
  type: dataJobs.backup,
  async run({ payload, db, volumes, progress }) {
    const b = await volumesRepo.backupById(db, payload.backupId);
    if (!b) throw new JobRefused('the backup was forgotten before it ran');
    if (b.status === 'completed') return;
    const vol = await volumesRepo.byId(db, payload.volumeId);
    if (!vol) throw new JobRefused('the volume was deleted before its backup');
    if (vol.node !== volumes.nodeId) throw new JobRefused(`the volume moved to node ${vol.node} before its backup`);
    let parent = b.parent;
    if (b.mode === null) {
      parent = await parentOf(db, b, (name) => volumes.hasBackupBase(payload.volumeId, name));
      await volumesRepo.updateBackup(db, b.id, { status: 'running', mode: parent ? 'incremental' : 'full', parent, error: null });
    } else if (b.status !== 'running') {
      await volumesRepo.updateBackup(db, b.id, { status: 'running', error: null });
    }
    const quota = vol.quota_gb * 1024 ** 3;
    const sent = await volumes.backup(payload.volumeId, { name: b.name, parent, description: b.description }, (bytes) => void progress(Math.min(99, (bytes / quota) * 100)).catch(() => undefined));
    await volumesRepo.updateBackup(db, b.id, { status: 'completed', sha256: sent.sha256, size_bytes: sent.bytes });
  },
  async onFailed({ payload, db, volumes }, error) {
    const b = await volumesRepo.backupById(db, payload.backupId);
    if (!b || b.status === 'completed') return;
    try {
      await volumes.abandonBackup(payload.volumeId, b.name);
    } finally {
      await volumesRepo.updateBackup(db, b.id, { status: 'failed', error: publicReason(error) });
    }
  },
});

/** The newest completed backup before `b` whose snapshot is still on the volume. */
async function parentOf(db: Parameters<typeof volumesRepo.backups>[0], b: BackupRow, onVolume: (name: string) => Promise<boolean>): Promise<string | null> {
  const done = (await volumesRepo.backups(db, b.volume_id)).filter((r) => r.status === 'completed' && r.id !== b.id).reverse();
  for (const r of done) if (await onVolume(r.name)) return r.name;
  return null;
}
