import type { DomainContext } from './context';
import type { Health } from '../core/apiTypes';

const CHECK_TIMEOUT_MS = 2000;

async function check(fn: () => Promise<unknown>): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([fn(), new Promise((_, reject) => (timer = setTimeout(() => reject(new Error('no answer within 2 s')), CHECK_TIMEOUT_MS)))]);
    return 'ok';
  } catch (e) {
    return `error: ${(e as Error).message}`;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * DESIGN.md §3: any failing check makes the host `degraded`. `storage` is what every node that
 * is up last said of its storage; `workers` counts worker processes over all nodes' queues;
 * `nodes` (an addition) says, per node, `ok` or why it is down.
 */
export async function checkHealth(ctx: DomainContext): Promise<Health> {
  const [db, redis] = await Promise.all([check(() => ctx.db.raw('select 1')), check(() => ctx.queue.ping())]);
  let nodes: Record<string, string> = {};
  let storage = 'ok';
  let workers = 0;
  if (db === 'ok') {
    const list = await ctx.nodes.list();
    nodes = Object.fromEntries(list.map((n) => [n.id, n.status === 'up' ? 'ok' : `down: ${n.reason}`]));
    const failing = list.filter((n) => n.status === 'up' && n.storage !== 'ok');
    if (failing.length) storage = failing.map((n) => (list.length > 1 ? `node ${n.id}: ${n.storage}` : n.storage)).join('; ');
    if (list.length === 0) storage = 'error: no node has registered';
    const counts = await Promise.all(list.map((n) => ctx.queue.workersAlive(n.id).catch(() => 0)));
    workers = counts.reduce((a, b) => a + b, 0);
  }
  const ok = db === 'ok' && redis === 'ok' && storage === 'ok' && workers > 0 && Object.values(nodes).every((v) => v === 'ok');
  return { status: ok ? 'ok' : 'degraded', checks: { db, redis, storage, workers, nodes } };
}
