import type { Worker } from 'bullmq';
import { boxesRepo } from '../db/repos/boxes';
import { nodesRepo } from '../db/repos/nodes';
import { publicReason } from '../jobs/publicReason';
import type { LocalNode } from './agent/localNode';
import type { WorkerContext } from './context';

/** What a box shows (its `error`, status still `running`) while its node brings it back. */
export const RECOVERING_REASON = "its node's storage stopped answering and is being restarted; the box is started again once it is back";

/** Boxes started again at once (each start is mostly runc; more only queue on the same cores). */
const START_CONCURRENCY = 4;

export interface StorageRecoveryReport {
  restarted: string[];
  failed: string[];
  ms: number;
}

/**
 * What a node does when its storage died or hung (the storage watchdog asks): no new jobs, the
 * storage restarted (daemon, pool, mounts), every container removed (each was cut off from its
 * root: its files answer "not connected"), and every box marked running started again on its
 * root, now mounted anew. A box that cannot be started fails with why; the others do not wait
 * for it. Data a box wrote and synced before is on its root: ZFS replays its intent log at the
 * import. Operations that were running fail their step and are retried by BullMQ once the worker
 * takes jobs again.
 *
 * While it runs the node's storage check answers `error: recovering: …` (so /healthz says
 * `storage: error` and GET /v1/nodes says why) and each box to be restarted shows
 * RECOVERING_REASON as its `error`. `announce` (the heartbeat's beat) writes the node row as the
 * recovery starts and as it ends: placement reads that row, so no box goes to a node that is
 * recovering, and none is refused for the stale error of a recovery that is over.
 */
export async function recoverStorage(ctx: WorkerContext, worker: Worker, local: LocalNode, why: string, announce?: () => Promise<void> | undefined): Promise<StorageRecoveryReport> {
  const t0 = Date.now();
  const log = ctx.log.child({ part: 'storage-recovery' });
  local.storageRecovering = why;
  void announce?.();
  // Jobs in flight fail on the dead storage and are retried later; none start meanwhile.
  await worker.pause(true);
  const report: StorageRecoveryReport = { restarted: [], failed: [], ms: 0 };
  try {
    const running = (await boxesRepo.onNode(ctx.db, ctx.config.nodeId)).filter((b) => b.status === 'running');
    for (const b of running) await boxesRepo.update(ctx.db, b.id, { error: RECOVERING_REASON });

    await ctx.storage.restart();
    log.warn({ ms: Date.now() - t0 }, 'storage restarted; starting its boxes again');
    // Stopped, not removed: each box keeps its user namespace, netns and address.
    for (const c of await ctx.runtime.list()) await ctx.runtime.stop(c.boxId, 0);

    const queue = [...running];
    const startOne = async () => {
      for (let box = queue.shift(); box; box = queue.shift()) {
        // Re-read: a delete may have been queued meanwhile; its job runs once the worker resumes.
        const now = await boxesRepo.byId(ctx.db, box.id);
        if (!now || now.status !== 'running') continue;
        try {
          await ctx.boxes.start(now);
          await boxesRepo.update(ctx.db, box.id, { error: null });
          report.restarted.push(box.id);
        } catch (e) {
          log.warn({ boxId: box.id, err: (e as Error).message }, 'a box could not be started again after the storage restart');
          await boxesRepo.update(ctx.db, box.id, { status: 'failed', error: publicReason(e) });
          report.failed.push(box.id);
        }
      }
    };
    await Promise.all(Array.from({ length: START_CONCURRENCY }, startOne));
    await nodesRepo.storageRestarted(ctx.db, ctx.config.nodeId);
    local.storageRestored();
    report.ms = Date.now() - t0;
    log.warn(report, 'storage recovery done');
    return report;
  } finally {
    local.storageRecovering = null;
    worker.resume();
    await announce?.();
  }
}
