import IORedis, { RedisOptions } from 'ioredis';
import type { Config } from '../core/config';
import { RedisExecSlots } from '../domain/exec';
import { RedisTickets } from '../domain/tickets';
import type { Db } from '../db/knex';
import type { ApiLimits } from './context';
import { createRequestLimiter } from './http/rateLimit';

/**
 * The api's limits on the cluster's Redis (the embedded one by default): request rates per
 * token and concurrent execs per box and token, shared by every api process. One connection of
 * their own that fails fast while Redis is down (the limiters then count in memory) instead of
 * queueing commands and holding requests.
 */
export async function createApiLimits(config: Config, db: Db, connection: RedisOptions, prefix: string, readyMs = 5000): Promise<ApiLimits & { close(): Promise<void> }> {
  const redis = new IORedis({ ...connection, enableOfflineQueue: false, maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined);
  // Commands fail fast rather than queue: wait for the connection once, so the first requests
  // count in Redis (an api may still start while Redis is down, and counts in memory then).
  if (redis.status !== 'ready') {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, readyMs);
      redis.once('ready', () => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
  return {
    requests: createRequestLimiter(redis, prefix, config.rateLimit),
    execSlots: new RedisExecSlots(redis, prefix, config.execLimits),
    tickets: new RedisTickets(db, redis, prefix),
    close: async () => {
      redis.disconnect();
    },
  };
}
