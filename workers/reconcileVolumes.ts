import { volumesRepo } from '../db/repos/volumes';
import { operationsRepo } from '../db/repos/operations';
import { volumeTurnKey } from '../jobs/dataJobs';
import { VolumeSteps } from './volumeSteps';
import { sweepEvictions } from './volumeEvictions';
import type { WorkerContext } from './context';

export interface VolumeReconcileReport {
  repairedVolumes: string[];
  failedBackups: string[];
  orphanVolumes: string[];
  /** Datasets of volumes that moved to another node, let go of (workers/volumeEvictions.ts). */
  movedAway: string[];
}

/**
 * The data volumes of this node after lost operations were failed (reconcile.ts): a volume whose
 * operation is gone is brought back to a state its user can act on (a create that never ended →
 * gone; a delete or restore → `ready`, a half-swapped restore undone), a backup left `pending` or
 * `running` → `failed` with its partial file and snapshot removed, and a dataset with no row (a
 * create or delete that died between its two halves) destroyed, and the datasets of volumes
 * that moved to another node let go of.
 */
export async function reconcileVolumes(ctx: WorkerContext): Promise<VolumeReconcileReport> {
  const report: VolumeReconcileReport = { repairedVolumes: [], failedBackups: [], orphanVolumes: [], movedAway: [] };
  const steps = new VolumeSteps({ volumes: ctx.volumes, backupDir: ctx.config.backupDir, nodeId: ctx.config.nodeId });
  const onDisk = await ctx.volumes.listVolumes();
  const rows = (await ctx.db('data_volumes').where({ node: ctx.config.nodeId })) as Awaited<ReturnType<typeof volumesRepo.byId>>[];
  const known = new Set<string>();
  for (const vol of rows) {
    if (!vol) continue;
    known.add(vol.id);
    if ((await operationsRepo.unfinishedForBox(ctx.db, volumeTurnKey(vol.id))).length > 0) continue;
    try {
      if (vol.state === 'creating') {
        await ctx.volumes.destroyVolume(vol.id);
        await volumesRepo.remove(ctx.db, vol.id);
      } else if (vol.state !== 'ready') {
        if (vol.state === 'restoring') await ctx.volumes.abandonRestore(vol.id);
        await volumesRepo.update(ctx.db, vol.id, { state: 'ready' });
      } else {
        const stuck = (await volumesRepo.backups(ctx.db, vol.id)).filter((b) => b.status === 'pending' || b.status === 'running');
        for (const b of stuck) {
          await steps.abandonBackup(vol.id, b.name);
          await volumesRepo.updateBackup(ctx.db, b.id, { status: 'failed', error: 'interrupted: its operation was lost' });
          report.failedBackups.push(b.id);
        }
        continue;
      }
      report.repairedVolumes.push(vol.id);
    } catch (e) {
      ctx.log.warn({ volumeId: vol.id, err: e }, 'reconciling a data volume failed');
    }
  }
  // A move to this node whose operation was lost (failed by reconciliation, which runs no
  // onFailed): the volume is left `restoring` on its old node's row, and a received copy here.
  const stranded = (await ctx.db('data_volumes').where({ state: 'restoring' }).whereNot({ node: ctx.config.nodeId })) as NonNullable<Awaited<ReturnType<typeof volumesRepo.byId>>>[];
  for (const vol of stranded) {
    if ((await operationsRepo.unfinishedForBox(ctx.db, volumeTurnKey(vol.id))).length > 0) continue;
    // Only a move to this node is this node's to settle (an in-place restore is its node's).
    const last = (await ctx.db('operations').where({ box_id: volumeTurnKey(vol.id), kind: 'data.restore' }).orderBy('seq', 'desc').first()) as { node: string } | undefined;
    if (last?.node !== ctx.config.nodeId) continue;
    await ctx.db('data_volumes').where({ id: vol.id, state: 'restoring' }).update({ state: 'ready' });
    // Whatever it received (whole, or half in tmp/restore-<id>) goes as a moved-away copy does.
    await volumesRepo.evict(ctx.db, vol.id, ctx.config.nodeId);
    report.repairedVolumes.push(vol.id);
  }
  for (const id of onDisk) {
    if (known.has(id)) continue;
    // Rows of other nodes are not here: only a volume no row names is an orphan.
    if (await volumesRepo.byId(ctx.db, id)) continue;
    await ctx.volumes.destroyVolume(id);
    report.orphanVolumes.push(id);
  }
  report.movedAway = await sweepEvictions(ctx);
  return report;
}
