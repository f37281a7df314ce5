import http from 'node:http';
import expressWs from 'express-ws';
import express from 'express';
import { Config, ConfigError, ensureDataDir } from '../core/config';
import { createLogger, Logger } from '../core/logger';
import { EmbeddedRedis, queuePrefix, redisOptions } from '../core/redis';
import { sha256 } from '../core/ids';
import { HTTP_BUFFER_BYTES, listen } from '../core/listen';
import { createDb, migrate, Db } from '../db/knex';
import { OperationQueue } from '../jobs/queue';
import { jobHandlers } from '../jobs';
import type { JobHandler } from '../jobs/types';
import { NodeDirectory } from '../domain/nodes';
import { startNode, NodeOptions, RunningNode } from '../workers/node';
import { createApp } from '../api/app';
import { createMetrics } from '../api/metrics';
import { createApiLimits } from '../api/limits';
import { startProxy } from '../api/proxy';
import { startWebhooks } from '../api/webhooks';
import { guardUpgrades } from '../api/http/upgrade';
import { MAX_WS_MESSAGE, mountSessionRoutes } from '../api/ws/sessions';
import type { ApiContext } from '../api/context';
import { loadAdminToken } from './adminToken';

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
      const admin = loadAdminToken(config);
      if (admin.generated) {
        // Printed once, at the start that made it; afterwards it is only in the file.
        process.stdout.write(`boxhost admin token (saved to ${admin.file}, shown once): ${admin.token}\n`);
      }
      host.adminToken = admin.token;
      const queue = new OperationQueue(db, connection, prefix);
      closers.push(() => queue.close());
      await queue.ready();
      const nodes = new NodeDirectory(db, { secret: config.clusterSecret, timeoutMs: config.nodeTimeoutMs });
      if (host.node && nodeRole === 'node') nodes.addLocal(host.node.local);
      const metrics = createMetrics(queue, nodes);
      const limits = await createApiLimits(config, db, connection, prefix);
      closers.push(limits.close);
      const api: ApiContext = {
        config,
        db,
        log: log.child({ part: 'api' }),
        queue,
        nodes,
        metrics: metrics.registry,
        adminTokenHash: sha256(admin.token),
        limits,
      };
      const app = express();
      app.disable('x-powered-by');
      const server = http.createServer({ highWaterMark: HTTP_BUFFER_BYTES }, app);
      // A file upload takes as long as it takes: only idle connections time out.
      server.requestTimeout = 0;
      mountSessionRoutes(expressWs(app, server, { wsOptions: { maxPayload: MAX_WS_MESSAGE } }).app);
      guardUpgrades(server, api);
      const routesApp = createApp(api, metrics.middleware);
      app.use(routesApp);
      host.api = api;
      host.app = routesApp;
      const webhooks = await startWebhooks(api, connection, prefix);
      closers.push(webhooks.close);
      const listening = await listen(server, config.port, config.host);
      closers.push(listening.close);
      host.url = listening.url;
      log.info({ url: host.url }, 'api listening');
      const proxy = await startProxy(api, config.proxyPort, config.host);
      closers.push(proxy.close);
      // Port 0 (tests) binds any free port: the api's publish urls name the one bound (its own
      // copy of the config: another host started from this config still binds a free port).
      if (config.proxyPort === 0) api.config = { ...config, proxyPort: proxy.port };
      host.proxyUrl = proxy.url;
      log.info({ url: proxy.url, domain: config.publishDomain }, 'publish proxy listening');
    }
    return host;
  } catch (e) {
    await close();
    throw e;
  }
}
