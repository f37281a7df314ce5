import type { DomainContext } from './context';
import type { Health } from '../core/apiTypes';
import { settleWithin } from '../core/timeout';

const CHECK_TIMEOUT_MS = 2000;

/** "ok", or that the check failed (the raw error goes to the log, not to this public route). */
async function check(ctx: DomainContext, name: string, fn: () => Promise<unknown>): Promise<string> {
  const outcome = await settleWithin(
    fn().then(() => 'ok', (e: Error) => e),
    CHECK_TIMEOUT_MS,
    new Error(`no answer within ${CHECK_TIMEOUT_MS / 1000} s`),
  );
  if (outcome === 'ok') return 'ok';
  ctx.log.warn({ check: name, err: (outcome as Error).message }, 'health check failed');
  return 'error';
}

/**
 * DESIGN.md §3: any failing check makes the host `degraded`. `storage` fails when a node that is
 * up last reported its storage failing; `workers` counts worker processes over all nodes'
 * queues; `nodes` (an addition) says, per node, `ok`, `down` or `storage error`.
 */
export async function checkHealth(ctx: DomainContext): Promise<Health> {
  const [db, redis] = await Promise.all([check(ctx, 'db', () => ctx.db.raw('select 1')), check(ctx, 'redis', () => ctx.queue.ping())]);
  let nodes: Record<string, string> = {};
  let storage = 'ok';
  let workers = 0;
  if (db === 'ok') {
    const list = await ctx.nodes.list({ committed: false });
    // Public route: which check fails, not why (GET /v1/nodes tells an admin the reasons).
    nodes = Object.fromEntries(list.map((n) => [n.id, n.status === 'up' ? (n.storage === 'ok' ? 'ok' : 'storage error') : 'down']));
    if (list.length === 0 || list.some((n) => n.status === 'up' && n.storage !== 'ok')) storage = 'error';
    const counts = await Promise.all(list.map((n) => ctx.queue.workersAlive(n.id).catch(() => 0)));
    workers = counts.reduce((a, b) => a + b, 0);
  }
  const ok = db === 'ok' && redis === 'ok' && storage === 'ok' && workers > 0 && Object.values(nodes).every((v) => v === 'ok');
  return { status: ok ? 'ok' : 'degraded', checks: { db, redis, storage, workers, nodes } };
}
