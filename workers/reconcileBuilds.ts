import { baseBuildsRepo } from '../db/repos/baseBuilds';
import { basesRepo } from '../db/repos/bases';
import { boxesRepo } from '../db/repos/boxes';
import type { WorkerContext } from './context';

/** A build with no box this long after it was asked for was cut off before it was queued. */
const UNQUEUED_GRACE_MS = 10 * 60 * 1000;

/**
 * Base builds that can no longer end by themselves (docs/bases.md "Builds"): one whose api died
 * between its steps (no temporary box after a grace period), or whose operation was lost (its
 * node's reconciliation failed it without running the job's clean-up). Each is failed, and what
 * it reserved (a `making` base version, its dataset) and its temporary box on this node go.
 */
export async function reconcileBuilds(ctx: WorkerContext): Promise<string[]> {
  const failed: string[] = [];
  for (const b of await baseBuildsRepo.unfinished(ctx.db)) {
    const box = b.box_id ? await boxesRepo.byId(ctx.db, b.box_id) : undefined;
    if (box && box.node !== ctx.config.nodeId) continue;
    const op = (await ctx.db('operations').where({ resource: `/v1/base-builds/${b.id}` }).whereIn('status', ['queued', 'running']).first()) as unknown;
    const stale = b.box_id === null ? Date.now() - Date.parse(b.created_at) > UNQUEUED_GRACE_MS : !op;
    if (!stale) continue;
    try {
      if (box) {
        await ctx.boxes.destroy(box);
        await boxesRepo.remove(ctx.db, box.id);
      }
      const row = await basesRepo.getAny(ctx.db, b.base, b.version);
      if (row?.state === 'making' && (b.reserved || b.replaced)) {
        await ctx.storage.destroyBase({ name: b.base, version: b.version }).catch(() => undefined);
        await basesRepo.dropMaking(ctx.db, b.base, b.version);
      }
      await baseBuildsRepo.update(ctx.db, b.id, { status: 'failed', error: 'interrupted: its operation was lost', box_id: null, box: null });
      failed.push(b.id);
    } catch (e) {
      ctx.log.warn({ buildId: b.id, err: e }, 'reconciling a base build failed');
    }
  }
  return failed;
}
