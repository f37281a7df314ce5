import type express from 'express';
import { Config, ConfigError, ensureDataDir } from '../core/config';
import { createLogger, Logger } from '../core/logger';
import { EmbeddedRedis, queuePrefix, redisOptions } from '../core/redis';
import { createDb, migrate, Db } from '../db/knex';
import { jobHandlers } from '../jobs';
import type { JobHandler } from '../jobs/types';
import { startNode, NodeOptions, RunningNode } from '../workers/node';
import type { ApiContext } from '../api/context';

/**
 * The parts one process can run (Procfile): `api` (unprivileged, anywhere), `node` (a machine
 * that holds boxes: worker + agent + heartbeat, as root) and `worker` (one more worker on a
 * node). `npm start` runs `api` and `node` together in one process.
 */
export type Role = 'api' | 'node' | 'worker';

export interface HostOptions {
  roles: Role[];
  /** Extra job handlers (tests register their own). */
  extraJobs?: JobHandler[];
  worker?: NodeOptions['worker'];
  drivers?: NodeOptions['drivers'];
  log?: Logger;
}

export interface Host {
  config: Config;
  log: Logger;
  db: Db;
  /** Base URL of the api (when it runs in this process). */
  url?: string;
  /** The publish proxy's own address (`BOXHOST_PROXY_PORT`). */
  proxyUrl?: string;
  adminToken: string;
  /** Present when a node or worker runs in this process. */
  node?: RunningNode;
  /** Present when the api runs in this process. */
  api?: ApiContext;
  app?: express.Express;
  close(): Promise<void>;
}

/** A node apart from the api is reached only through its agent: it needs the secret and an
 *  address the api can dial. */
function checkRoles(config: Config, roles: Role[]): void {
  if (roles.includes('node') && !roles.includes('api') && !config.clusterSecret) {
    throw new ConfigError('BOXHOST_CLUSTER_SECRET is required for a node that runs apart from the api (the api reaches it through its agent)');
  }
  if (config.clusterSecret && roles.includes('node') && !config.agentUrl && /^(0\.0\.0\.0|::|\[::\])$/.test(config.agentHost)) {
    throw new ConfigError(`BOXHOST_AGENT_URL is required when the agent listens on ${config.agentHost} (say where the api reaches it)`);
  }
}

/**
 * Starts the parts of a host this process runs. Any part starts the embedded Redis when none is
 * configured, and runs migrations. A node starts before the api, so that the api's first
 * request finds it registered.
 */
export async function startHost(config: Config, opts: HostOptions): Promise<Host> {
  checkRoles(config, opts.roles);
  ensureDataDir(config);
  const log = opts.log ?? createLogger(config.logLevel);
  const closers: (() => Promise<unknown>)[] = [];
  // Once, however often it is called: a second call waits for the first.
  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      for (const c of closers.reverse()) await c().catch((e) => log.warn({ err: (e as Error).message }, 'close step failed'));
    })());
  try {
    const embedded = new EmbeddedRedis(config, log.child({ part: 'redis' }));
    await embedded.start();
    closers.push(() => embedded.stop());

    const db = createDb(config);
    closers.push(() => db.destroy());
    await migrate(db);

    const connection = redisOptions(config);
    const prefix = queuePrefix(config);
    const host: Host = { config, log, db, adminToken: '', close };

    const nodeRole = opts.roles.includes('node') ? 'node' : opts.roles.includes('worker') ? 'worker' : null;
    if (nodeRole) {
      host.node = await startNode({
        config,
        db,
        log,
        connection,
        prefix,
        handlers: [...jobHandlers, ...(opts.extraJobs ?? [])],
        role: nodeRole,
        worker: opts.worker,
        drivers: opts.drivers,
      });
      closers.push(() => host.node!.close());
    }

    if (opts.roles.includes('api')) {
      // Loaded here: a process that runs no api never loads the routes, sessions, webhooks or the publish proxy.
      const { startApiRole } = await import('./apiRole');
      const api = await startApiRole({ config, db, log, connection, prefix, localNode: nodeRole === 'node' ? host.node : undefined, closers });
      host.adminToken = api.adminToken;
      host.api = api.api;
      host.app = api.app;
      host.url = api.url;
      host.proxyUrl = api.proxyUrl;
    }
    return host;
  } catch (e) {
    await close();
    throw e;
  }
}
