import { boxesRepo } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { projectsRepo } from '../db/repos/projects';
import { repairFor } from '../core/box';
import { publicReason } from '../jobs/publicReason';
import type { WorkerContext } from './context';
import { reconcileVolumes, type VolumeReconcileReport } from './reconcileVolumes';
import { reconcileBuilds } from './reconcileBuilds';

export interface ReconcileReport extends VolumeReconcileReport {
  lostOperations: string[];
  /** Base builds failed because they could no longer end (reconcileBuilds.ts). */
  failedBuilds: string[];
  restarted: string[];
  stopped: string[];
  failed: string[];
  orphanContainers: string[];
  orphanRoots: string[];
  orphanNetworks: string[];
}

/**
 * Makes db rows, runc state and ZFS datasets agree again, at worker start. Operations whose
 * job is gone fail first, so the boxes behind them are judged as they are. Boxes with an
 * operation still queued or running are left to it (BullMQ runs it again); for the rest the row
 * is the truth: a box marked running whose container is gone is started again, a box stuck in
 * a transitional state with no operation behind it fails with why, and host objects with no row
 * at all (a create that died before its row was written back, a delete that died after) go.
 */
export async function reconcile(ctx: WorkerContext): Promise<ReconcileReport> {
  const report: ReconcileReport = { lostOperations: [], failedBuilds: [], restarted: [], stopped: [], failed: [], orphanContainers: [], orphanRoots: [], orphanNetworks: [], repairedVolumes: [], failedBackups: [], orphanVolumes: [], movedAway: [] };
  // An operation whose job is gone (Redis lost it) or ended without the operation hearing of
  // it (BullMQ gave up on a job that stalled too often) would hold its box's queue forever.
  for (const op of await operationsRepo.unfinishedOnNode(ctx.db, ctx.config.nodeId)) {
    const state = await ctx.jobState(op.id);
    if (state !== 'missing' && state !== 'failed' && state !== 'completed') continue;
    await operationsRepo.update(ctx.db, op.id, { status: 'failed', error: `lost: its job is ${state}` });
    report.lostOperations.push(op.id);
  }

  // Host objects are listed before the rows are read: another worker of this node may be making
  // a new box meanwhile, and its row exists before its first object does, so whatever is listed
  // here without a row is truly an orphan.
  const [containers, netns, roots] = await Promise.all([ctx.runtime.list(), ctx.network.listAttached(), ctx.storage.listBoxRoots()]);
  const boxes = await boxesRepo.onNode(ctx.db, ctx.config.nodeId);
  const known = new Set(boxes.map((b) => b.id));

  for (const box of boxes) {
    if ((await operationsRepo.unfinishedForBox(ctx.db, box.id)).length > 0) continue;
    const container = await ctx.runtime.status(box.id);
    const repair = repairFor(box.status, container === 'running' || container === 'paused');
    try {
      // Paused with nothing in flight: a snapshot's worker died in the instant it held the box
      // still. It thaws (a stopped box's container is stopped below, paused or not).
      if (container === 'paused' && box.status === 'running') {
        await ctx.runtime.unpause(box.id);
        report.restarted.push(box.id);
      }
      if (repair === 'start') {
        if (!(await ctx.storage.hasBoxRoot(box.id))) throw new Error('its root dataset is gone');
        await ctx.boxes.start(box);
        report.restarted.push(box.id);
      } else if (repair === 'stop') {
        await ctx.boxes.stop(box);
        report.stopped.push(box.id);
      } else if (repair === 'fail-interrupted') {
        throw new Error(`interrupted while ${box.status}: its operation was lost`);
      }
    } catch (e) {
      ctx.log.warn({ boxId: box.id, err: e }, 'reconciliation failed a box');
      await boxesRepo.update(ctx.db, box.id, { status: 'failed', error: publicReason(e) });
      report.failed.push(box.id);
    }
  }

  for (const c of containers) {
    if (known.has(c.boxId)) continue;
    await ctx.runtime.remove(c.boxId);
    report.orphanContainers.push(c.boxId);
  }
  const projects = await projectsRepo.list(ctx.db);
  for (const id of netns) {
    if (known.has(id)) continue;
    // The bridge of an orphan is unknown: detaching from each project network is harmless.
    for (const p of projects) await ctx.network.detach(id, { index: p.net_index }).catch(() => undefined);
    report.orphanNetworks.push(id);
  }
  // A project whose last box here was an orphan keeps no bridge (false where one is in use).
  if (report.orphanNetworks.length) for (const p of projects) await ctx.network.releaseProject({ index: p.net_index }).catch(() => false);
  for (const id of roots) {
    if (known.has(id)) continue;
    await ctx.storage.destroyBoxRoot(id);
    report.orphanRoots.push(id);
  }
  report.failedBuilds = await reconcileBuilds(ctx).catch((e: Error) => {
    ctx.log.warn({ err: e.message }, 'reconciling base builds failed');
    return [];
  });
  Object.assign(report, await reconcileVolumes(ctx).catch((e: Error) => {
    ctx.log.warn({ err: e.message }, 'reconciling data volumes failed');
    return {};
  }));
  await ctx.runtime.tidy().catch((e) => ctx.log.warn({ err: (e as Error).message }, 'tidying the runtime failed'));
  const touched = Object.values(report).some((l) => l.length > 0);
  ctx.log[touched ? 'warn' : 'info'](report, 'reconciled host state with the db');
  return report;
}
