import type { ApiContext } from '../context';
import { withTimeout } from '../../jobs/queue';

const CHECK_TIMEOUT_MS = 2000;

async function check(fn: () => Promise<unknown>): Promise<string> {
  try {
    await withTimeout(fn(), CHECK_TIMEOUT_MS, 'no answer within 2 s');
    return 'ok';
  } catch (e) {
    return `error: ${(e as Error).message}`;
  }
}

/** DESIGN.md §3: any failing check (or no live worker) makes the host `degraded`. */
export async function checkHealth(api: ApiContext) {
  const [db, redis, storage, workers] = await Promise.all([
    check(() => api.db.raw('select 1')),
    check(() => api.redis.ping()),
    check(() => api.storage.health()),
    api.queue.workersAlive().catch(() => 0),
  ]);
  const ok = db === 'ok' && redis === 'ok' && storage === 'ok' && workers > 0;
  return { status: ok ? 'ok' : 'degraded', checks: { db, redis, storage, workers } };
}
