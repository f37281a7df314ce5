import { volumesRepo, type BackupRow } from '../db/repos/volumes';
import { boxesRepo } from '../db/repos/boxes';
import { VOLUME_HOLDING_STATUSES } from '../core/box';
import type { BackupStream } from './ports';
import { dataJobs } from './dataJobs';
import { defineJob, JobRefused } from './types';

/**
 * Brings a data volume back to one of its snapshots (a rollback) or to a backup (its chain of
 * streams, full then incrementals, each checked against its sha256 before anything is touched,
 * received into a new dataset that takes the volume's place). Refused while a box that has the
 * volume attached runs. Idempotent: the restore's operation id marks the dataset it made.
 */
export const restoreDataJob = defineJob({
  type: dataJobs.restore,
  async run({ payload, db, volumes, operationId }) {
    const vol = await volumesRepo.byId(db, payload.volumeId);
    if (!vol) throw new JobRefused('the volume was deleted before its restore');
    // A move (docs/data.md "Moving a volume to another node") runs on the node it goes to.
    if (payload.node !== undefined && payload.node !== volumes.nodeId) throw new JobRefused(`the move of volume ${vol.name} to node ${payload.node} ran on node ${volumes.nodeId}`);
    const moving = payload.node !== undefined && vol.node !== payload.node;
    for (const a of await volumesRepo.holders(db, vol.id)) {
      const box = await boxesRepo.byId(db, a.box_id);
      if (moving && box) throw new JobRefused(`volume ${vol.name} is attached to box ${a.project}/${a.box} on node ${vol.node}; detach it before moving it`);
      if (box && VOLUME_HOLDING_STATUSES.has(box.status)) throw new JobRefused(`volume ${vol.name} is attached to box ${a.project}/${a.box}, which is ${box.status}; stop it (or detach the volume) first`);
    }
    try {
      if (payload.snapshot !== undefined) await volumes.rollback(vol.id, payload.snapshot);
      else await volumes.restore(vol.id, await chainOf(db, payload.backupId!), vol.quota_gb, operationId);
    } catch (e) {
      // The storage's refusals (a later snapshot taken meanwhile, the snapshot gone) are final.
      if ((e as { code?: string }).code === 'conflict' || /has no snapshot/.test((e as Error).message)) throw new JobRefused((e as Error).message);
      throw e;
    }
    const patch = { state: 'ready' as const, size_bytes: await volumes.usedBytes(vol.id) };
    // The old node destroys its dataset when it next looks (workers/volumeEvictions.ts).
    if (payload.node !== undefined) await volumesRepo.settleMove(db, vol.id, payload.node, patch);
    else await volumesRepo.update(db, vol.id, patch);
  },
  async onFailed({ payload, db, volumes }) {
    try {
      // A swap cut off half-way puts the old dataset back; a half-received one goes.
      const vol = await volumesRepo.byId(db, payload.volumeId);
      if (vol) await volumes.abandonRestore(payload.volumeId);
      // A move that failed after its receive leaves a dataset here that the volume's node is
      // not: it goes as a moved-away one does.
      if (vol && payload.node !== undefined && vol.node !== volumes.nodeId) await volumesRepo.evict(db, vol.id, volumes.nodeId);
    } finally {
      const vol = await volumesRepo.byId(db, payload.volumeId);
      if (vol?.state === 'restoring') await volumesRepo.update(db, payload.volumeId, { state: 'ready' });
    }
  },
});

/** The streams a backup needs, oldest (its full backup) first. */
export async function chainOf(db: Parameters<typeof volumesRepo.backupById>[0], backupId: string): Promise<BackupStream[]> {
  const out: BackupStream[] = [];
  let b: BackupRow | undefined = await volumesRepo.backupById(db, backupId);
  if (!b) throw new JobRefused('the backup was forgotten before the restore');
  for (;;) {
    if (b.status !== 'completed' || !b.sha256) throw new JobRefused(`backup ${b.name} is ${b.status}; only a completed backup restores`);
    out.unshift({ backup: b.name, sha256: b.sha256 });
    if (b.mode !== 'incremental') return out;
    const parentName: string | null = b.parent;
    const parent: BackupRow | undefined = parentName ? await volumesRepo.backup(db, b.volume_id, parentName) : undefined;
    if (!parent) throw new JobRefused(`backup ${b.name} is incremental on ${parentName}, which is gone`);
    if (out.length > 10_000) throw new JobRefused('the backup chain is too long');
    b = parent;
  }
}
