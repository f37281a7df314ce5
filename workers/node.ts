import fs from 'node:fs';
import path from 'node:path';
import { Queue, type ConnectionOptions, type Worker } from 'bullmq';
import type { RedisOptions } from 'ioredis';
import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import { versionInfo } from '../core/version';
import type { Db } from '../db/knex';
import { boxesRepo } from '../db/repos/boxes';
import { nodeQueueName } from '../jobs/queue';
import type { JobHandler } from '../jobs/types';
import { BoxSteps } from './boxSteps';
import { LINK_LOCAL } from '../core/netblocks';
import { PackageSources } from './bases/packageSources';
import { SourcesProxy } from './bases/sourcesProxy';
import { RecipeBases, type RecipeBasesDeps } from './bases/recipeBases';
import { dropStaleUploads, stagingDirOf } from './baseSteps';
import type { WorkerContext } from './context';
import { createDrivers, Drivers, platformDestinations, prepareHost } from './setup';
import { sweepEvictions } from './volumeEvictions';
import { startWorker, WorkerOptions } from './worker';
import { LocalNode } from './agent/localNode';
import { Agent, startAgent } from './agent/server';
import { describeNode, Heartbeat, startHeartbeat } from './heartbeat';
import { startStorageWatchdog, StorageWatchdog } from './storageWatchdog';
import { useSpawner } from '../core/spawner';
import { AgentWatchdog, startAgentWatchdog } from './agentWatchdog';
import { recoverStorage } from './storageRecovery';

/** How often a node looks for datasets of volumes that moved away (one indexed query). */
const EVICTION_SWEEP_MS = 10_000;

/** Runs `fn` every `ms`, never two at once; answers the closer that stops it. */
function everyFewSeconds(ms: number, fn: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | undefined;
  const timer = setInterval(() => {
    running ??= fn().finally(() => (running = undefined));
  }, ms);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await running;
  };
}

export interface NodeOptions {
  config: Config;
  db: Db;
  log: Logger;
  connection: RedisOptions;
  prefix: string;
  handlers: JobHandler[];
  /** `node`: the whole node (set-up, reconciliation, worker, agent, heartbeat); `worker`: one
   *  more worker process on a node whose `node` process runs elsewhere. */
  role: 'node' | 'worker';
  worker?: Partial<Pick<WorkerOptions, 'lockDurationMs' | 'stalledIntervalMs' | 'concurrency'>>;
  /** Drivers to use instead of the machine's (tests). */
  drivers?: Drivers;
  /** What fills a recipe base instead of mmdebstrap (unit tests with mock drivers). */
  recipeFill?: RecipeBasesDeps['fill'];
}

export interface RunningNode {
  ctx: WorkerContext;
  local: LocalNode;
  worker: Worker;
  agent?: Agent;
  /** The `node` role's storage watchdog (absent with BOXHOST_STORAGE_WATCHDOG_SECS=0). */
  watchdog?: StorageWatchdog;
  /** The `node` role's agent watchdog (absent with BOXHOST_AGENT_CHECK_SECS=0). */
  agentWatchdog?: AgentWatchdog;
  close(): Promise<void>;
}

/**
 * One machine's host side: drivers, the box steps made of them, the worker on the node's own
 * queue and, for the `node` role, the set-up and reconciliation before it, the agent (when a
 * cluster secret is configured) and the heartbeat that registers the node.
 */
export async function startNode(opts: NodeOptions): Promise<RunningNode> {
  const { config, db } = opts;
  const log = opts.log.child({ part: opts.role, node: config.nodeId });
  lowerOwnOomScore(log);
  const closers: (() => Promise<unknown>)[] = [];
  const close = async () => {
    for (const c of closers.reverse()) await c().catch((e) => log.warn({ err: (e as Error).message }, 'close step failed'));
  };
  try {
    const drivers = opts.drivers ?? createDrivers(config, log);
    // Only read by reconciliation: which operations still have a job behind them.
    const inspect = new Queue(nodeQueueName(config.nodeId), { connection: opts.connection as ConnectionOptions, prefix: opts.prefix });
    inspect.on('error', () => undefined);
    closers.push(() => inspect.close());
    const jobState = async (id: string) => ((await inspect.getJob(id)) ? String(await inspect.getJobState(id)) : 'missing');
    // Where the node's Debian sources are read: BOXHOST_DEBIAN_SOURCES, else apt's own.
    const sourcePlaces = config.debianSources.length > 0 ? config.debianSources : undefined;
    const recipes = new RecipeBases({
      db, storage: drivers.storage, log, workRoot: path.join(config.dataDir, 'recipes'), timeoutMs: config.buildTimeoutSecs * 1000,
      limits: config.baseImport, sourcePlaces, fill: opts.recipeFill,
    });
    // What a build box reaches while its script runs (BOXHOST_BUILD_SOURCES): the node's
    // package sources, by name, through a proxy of this process.
    let sourcesProxy: SourcesProxy | undefined;
    if (config.buildSources) {
      const sources = new PackageSources(sourcePlaces);
      // Never where boxes' outbound traffic is refused, whatever a source's name resolves to.
      let refused: Promise<string[]> | undefined;
      const refusedNow = () => (refused ??= platformDestinations(config).then((d) => [LINK_LOCAL, config.boxSubnet, ...d.filter((x) => !x.includes(':'))]));
      const proxy = new SourcesProxy({ endpoints: () => sources.endpoints(), refused: refusedNow, log: log.child({ part: 'sources-proxy' }) });
      closers.push(() => proxy.close());
      sourcesProxy = proxy;
    }
    const ctx: WorkerContext = { config, db, log, ...drivers, boxes: new BoxSteps({ db, ...drivers, recipes, proxyPort: config.proxyPort }), recipes, sourcesProxy, jobState };
    const local = new LocalNode(config.nodeId, drivers.runtime, drivers.storage, drivers.volumes);
    local.maxConcurrentExecs = config.execLimits.perNode;
    local.baseImports = { stagingDir: stagingDirOf(config), ...config.baseImport };
    // Uploads a day old have no job left that wants them (an api that died between staging and queueing).
    if (opts.role === 'node') {
      const sweep = () => dropStaleUploads(stagingDirOf(config), 24 * 3600_000).catch((e) => log.warn({ err: String(e) }, 'could not sweep stale base uploads'));
      await sweep();
      const timer = setInterval(sweep, 3600_000);
      timer.unref();
      closers.push(async () => clearInterval(timer));
    }

    // Host commands start from a small helper process, not from this one (core/spawner.ts).
    if (config.spawner) useSpawner();
    if (opts.role === 'node') await prepareHost(ctx);
    const worker = startWorker(ctx, opts.handlers, {
      connection: opts.connection,
      prefix: opts.prefix,
      concurrency: opts.worker?.concurrency ?? config.workerConcurrency,
      lockDurationMs: opts.worker?.lockDurationMs,
      stalledIntervalMs: opts.worker?.stalledIntervalMs,
    });
    await worker.waitUntilReady();
    closers.push(() => worker.close());
    log.info({ queue: nodeQueueName(config.nodeId) }, 'taking jobs');
    // Datasets of volumes moved to another node go soon after the move (docs/data.md).
    if (opts.role === 'node') closers.push(everyFewSeconds(EVICTION_SWEEP_MS, () => sweepEvictions(ctx).then((gone) => {
      if (gone.length) log.info({ volumes: gone }, 'let go of the datasets of volumes moved to another node');
    }).catch((e) => log.warn({ err: String(e) }, 'could not sweep moved volumes'))));

    let agent: Agent | undefined;
    let heartbeat: Heartbeat | undefined;
    if (opts.role === 'node') {
      if (config.clusterSecret) {
        agent = await startAgent({
          node: local,
          secret: config.clusterSecret,
          host: config.agentHost,
          port: config.agentPort,
          log: log.child({ part: 'agent' }),
          holdsBox: async (id) => (await boxesRepo.byId(db, id))?.node === config.nodeId,
          addressOf: async (id) => (await boxesRepo.byId(db, id))?.address ?? null,
        });
        closers.push(() => agent!.close());
        log.info({ url: agent.url }, 'node agent listening');
      }
      const registration = await describeNode({
        id: config.nodeId,
        name: config.nodeName,
        region: config.region,
        agentUrl: agent ? (config.agentUrl ?? agent.url) : null,
        version: versionInfo().version,
        cpus: config.nodeCpus,
        ramMb: config.nodeRamMb,
        overcommit: config.overcommit,
        diskBytes: await drivers.storage.capacityBytes(),
        rootLimit: await drivers.storage.rootLimit(),
      });
      heartbeat = await startHeartbeat(db, local, registration, config.heartbeatMs, log, () => drivers.storage.rootLimit());
      closers.push(() => heartbeat!.stop());
    }
    // One watchdog per machine's node: a `worker` process beside it leaves the storage to it.
    let watchdog: StorageWatchdog | undefined;
    if (opts.role === 'node' && config.storageWatchdog.intervalMs > 0) {
      watchdog = startStorageWatchdog({
        storage: drivers.storage,
        log,
        intervalMs: config.storageWatchdog.intervalMs,
        hangMs: config.storageWatchdog.hangMs,
        recover: async (why) => void (await recoverStorage(ctx, worker, local, why, () => heartbeat?.beat())),
      });
      // Stopped first on close: no recovery may start on a node that is going away.
      closers.push(() => watchdog!.stop());
    }
    let agentWatchdog: AgentWatchdog | undefined;
    if (opts.role === 'node' && config.agentWatchdog.intervalMs > 0) {
      agentWatchdog = startAgentWatchdog({
        ctx,
        intervalMs: config.agentWatchdog.intervalMs,
        timeoutMs: config.agentWatchdog.timeoutMs,
        paused: () => local.storageRecovering !== null,
      });
      closers.push(() => agentWatchdog!.stop());
    }
    return { ctx, local, worker, agent, watchdog, agentWatchdog, close };
  } catch (e) {
    await close();
    throw e;
  }
}

/** What the node process asks for its own OOM score (dockerd's): boxes (800) go first. */
const NODE_OOM_SCORE_ADJ = -500;
let oomScoreTried = false;

/**
 * Best effort, once per process: lowering one's OOM score below 0 needs CAP_SYS_RESOURCE, which
 * some hosts (this build machine) do not give root; the node then stays at its inherited score,
 * still well below the boxes'.
 */
function lowerOwnOomScore(log: Logger): void {
  if (oomScoreTried) return;
  oomScoreTried = true;
  try {
    fs.writeFileSync('/proc/self/oom_score_adj', String(NODE_OOM_SCORE_ADJ));
  } catch (e) {
    log.warn({ err: (e as Error).message, want: NODE_OOM_SCORE_ADJ }, 'cannot lower the node process\'s OOM score; it keeps its own');
  }
}
