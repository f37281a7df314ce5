import http from 'node:http';
import type { AddressInfo } from 'node:net';
import IORedis from 'ioredis';
import { ConnectionOptions, Queue, type Worker } from 'bullmq';
import expressWs from 'express-ws';
import express from 'express';
import { Config, ensureDataDir } from './config';
import { createLogger, Logger } from './logger';
import { EmbeddedRedis, queuePrefix, redisOptions } from './redis';
import { loadAdminToken } from './adminToken';
import { sha256 } from './ids';
import { createDb, migrate, Db } from '../db/knex';
import { OperationQueue, nodeQueueName } from '../jobs/queue';
import { jobKinds } from '../jobs';
import type { JobKind } from '../jobs/types';
import { startWorker, WorkerOptions } from '../workers/worker';
import { createDrivers, prepareHost } from '../workers/setup';
import type { WorkerContext } from '../workers/context';
import { createApp } from '../api/app';
import { createMetrics } from '../api/metrics';
import type { ApiContext } from '../api/context';

export type Role = 'api' | 'worker';

export interface HostOptions {
  roles: Role[];
  /** Extra job kinds (tests register their own). */
  extraJobs?: JobKind[];
  worker?: Partial<Pick<WorkerOptions, 'lockDurationMs' | 'stalledIntervalMs' | 'concurrency'>>;
  log?: Logger;
}

export interface Host {
  config: Config;
  log: Logger;
  db: Db;
  /** Base URL of the api (when it runs in this process). */
  url?: string;
  adminToken: string;
  worker?: Worker;
  workerContext?: WorkerContext;
  /** Present when the api runs in this process. */
  api?: ApiContext;
  app?: express.Express;
  close(): Promise<void>;
}

/**
 * Starts the parts of a host this process runs: the api, the worker, or both (`npm start`).
 * Either part alone starts the embedded Redis when none is configured, and runs migrations.
 */
export async function startHost(config: Config, opts: HostOptions): Promise<Host> {
  ensureDataDir(config);
  const log = opts.log ?? createLogger(config.logLevel);
  const closers: (() => Promise<unknown>)[] = [];
  const close = async () => {
    for (const c of closers.reverse()) await c().catch((e) => log.warn({ err: (e as Error).message }, 'close step failed'));
  };
  try {
    const embedded = new EmbeddedRedis(config, log.child({ part: 'redis' }));
    await embedded.start();
    closers.push(() => embedded.stop());

    const db = createDb(config);
    closers.push(() => db.destroy());
    await migrate(db);

    const admin = loadAdminToken(config);
    if (admin.generated) {
      // Printed once, at the start that made it; afterwards it is only in the file.
      process.stdout.write(`boxhost admin token (saved to ${admin.file}, shown once): ${admin.token}\n`);
    }

    const connection = redisOptions(config);
    const prefix = queuePrefix(config);
    const drivers = createDrivers(config, log);
    const host: Host = { config, log, db, adminToken: admin.token, close };

    if (opts.roles.includes('worker')) {
      // Only read by reconciliation: which operations still have a job behind them.
      const inspect = new Queue(nodeQueueName(config.nodeId), { connection: connection as ConnectionOptions, prefix });
      inspect.on('error', () => undefined);
      closers.push(() => inspect.close());
      const jobState = async (id: string) => (await inspect.getJob(id)) ? String(await inspect.getJobState(id)) : 'missing';
      const ctx: WorkerContext = { config, db, log: log.child({ part: 'worker' }), ...drivers, jobState };
      await prepareHost(ctx);
      const worker = startWorker(ctx, [...jobKinds, ...(opts.extraJobs ?? [])], {
        connection,
        prefix,
        concurrency: opts.worker?.concurrency ?? config.workerConcurrency,
        lockDurationMs: opts.worker?.lockDurationMs,
        stalledIntervalMs: opts.worker?.stalledIntervalMs,
      });
      await worker.waitUntilReady();
      closers.push(() => worker.close());
      host.worker = worker;
      host.workerContext = ctx;
    }

    if (opts.roles.includes('api')) {
      const queue = new OperationQueue(db, connection, prefix, config.nodeId);
      closers.push(() => queue.close());
      const redis = new IORedis({ ...connection, maxRetriesPerRequest: 1, enableOfflineQueue: false });
      redis.on('error', () => undefined);
      closers.push(async () => redis.disconnect());
      const metrics = createMetrics(queue);
      const api: ApiContext = {
        config,
        db,
        log: log.child({ part: 'api' }),
        redis,
        queue,
        runtime: drivers.runtime,
        storage: drivers.storage,
        metrics: metrics.registry,
        adminTokenHash: sha256(admin.token),
      };
      const app = express();
      app.disable('x-powered-by');
      const server = http.createServer(app);
      expressWs(app, server);
      const routesApp = createApp(api, metrics.middleware);
      app.use(routesApp);
      host.api = api;
      host.app = routesApp;
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(config.port, config.host, () => resolve());
      });
      closers.push(
        () =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      );
      const addr = server.address() as AddressInfo;
      const hostPart = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
      host.url = `http://${hostPart}:${addr.port}`;
      log.info({ url: host.url }, 'api listening');
    }
    return host;
  } catch (e) {
    await close();
    throw e;
  }
}
