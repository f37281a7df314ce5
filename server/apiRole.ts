import http from 'node:http';
import expressWs from 'express-ws';
import express from 'express';
import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { RedisOptions } from 'ioredis';
import { sha256 } from '../core/ids';
import { HTTP_BUFFER_BYTES, listen } from '../core/listen';
import type { Db } from '../db/knex';
import { OperationQueue } from '../jobs/queue';
import { NodeDirectory } from '../domain/nodes';
import type { RunningNode } from '../workers/node';
import { createApp } from '../api/app';
import { createMetrics } from '../api/metrics';
import { createApiLimits } from '../api/limits';
import { startProxy } from '../api/proxy';
import { startWebhooks } from '../api/webhooks';
import { guardUpgrades } from '../api/http/upgrade';
import { MAX_WS_MESSAGE, mountSessionRoutes } from '../api/ws/sessions';
import type { ApiContext } from '../api/context';
import { loadAdminToken } from './adminToken';
import { pruneOperations } from '../domain/operations';

/** How often an api drops the finished operations past BOXHOST_OPERATIONS_KEEP_DAYS. */
const OPERATIONS_PRUNE_MS = 3600_000;

export interface ApiRoleOptions {
  config: Config;
  db: Db;
  log: Logger;
  connection: RedisOptions;
  prefix: string;
  /** The node of this process (`npm start`): the api reaches its boxes without a hop. */
  localNode?: RunningNode;
  /** Each part started is added here, to be closed in reverse order. */
  closers: (() => Promise<unknown>)[];
}

export interface ApiRole {
  adminToken: string;
  api: ApiContext;
  app: express.Express;
  url: string;
  proxyUrl: string;
}

/**
 * The api part of a host: routes, WebSocket sessions, webhooks and the publish proxy. Its own
 * module, loaded only by a process that runs the api (server/host.ts): a node or worker process
 * never loads the routes, sessions, webhooks or the publish proxy (a worker starts ~0.4 s sooner
 * here; express itself it still loads, for the node agent).
 */
export async function startApiRole(o: ApiRoleOptions): Promise<ApiRole> {
  const { config, db, log, connection, prefix, closers } = o;
  const admin = loadAdminToken(config);
  if (admin.generated) {
    // Printed once, at the start that made it; afterwards it is only in the file.
    process.stdout.write(`boxhost admin token (saved to ${admin.file}, shown once): ${admin.token}\n`);
  }
  const queue = new OperationQueue(db, connection, prefix);
  closers.push(() => queue.close());
  await queue.ready();
  const nodes = new NodeDirectory(db, { secret: config.clusterSecret, timeoutMs: config.nodeTimeoutMs });
  if (o.localNode) nodes.addLocal(o.localNode.local);
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
  if (config.operationsKeepDays > 0) {
    const prune = () =>
      pruneOperations(api, config.operationsKeepDays)
        .then((n) => n && api.log.info({ dropped: n, keepDays: config.operationsKeepDays }, 'dropped finished operations past their keeping time'))
        .catch((e) => api.log.warn({ err: String(e) }, 'could not drop old operations'));
    void prune(); // not awaited: the api serves while a first sweep runs
    const timer = setInterval(prune, OPERATIONS_PRUNE_MS);
    timer.unref();
    closers.push(async () => clearInterval(timer));
  }
  const app = express();
  app.disable('x-powered-by');
  const server = http.createServer({ highWaterMark: HTTP_BUFFER_BYTES }, app);
  // A file upload takes as long as it takes: only idle connections time out.
  server.requestTimeout = 0;
  mountSessionRoutes(expressWs(app, server, { wsOptions: { maxPayload: MAX_WS_MESSAGE } }).app);
  guardUpgrades(server, api);
  const routesApp = createApp(api, metrics.middleware);
  app.use(routesApp);
  const webhooks = await startWebhooks(api, connection, prefix);
  closers.push(webhooks.close);
  const listening = await listen(server, config.port, config.host);
  closers.push(listening.close);
  log.info({ url: listening.url }, 'api listening');
  const proxy = await startProxy(api, config.proxyPort, config.host);
  closers.push(proxy.close);
  // Port 0 (tests) binds any free port: the api's publish urls name the one bound (its own
  // copy of the config: another host started from this config still binds a free port).
  if (config.proxyPort === 0) api.config = { ...config, proxyPort: proxy.port };
  log.info({ url: proxy.url, domain: config.publishDomain }, 'publish proxy listening');
  return { adminToken: admin.token, api, app: routesApp, url: listening.url, proxyUrl: proxy.url };
}
