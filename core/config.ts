import { cidrError } from './addressPolicy';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import Joi from 'joi';
import dotenv from 'dotenv';
import { DEFAULT_BOX_SUBNET, defaultProjectPrefix, formatIpv4, MAX_PROJECT_PREFIX, parseNet } from './netblocks';

/** Every setting of a host, read once from the environment (and `.env`). */
export interface Config {
  port: number;
  host: string;
  dataDir: string;
  adminToken?: string;
  databaseUrl?: string;
  redisUrl?: string;
  zfsPool?: string;
  poolSizeGb: number;
  publishDomain: string;
  /** How long a generation replaced by a deploy keeps serving before it is stopped (docs/packs.md). */
  deployDrainSecs: number;
  /** An event stream ends after this long (the client reconnects with Last-Event-ID). */
  eventStreamMaxSecs: number;
  proxyPort: number;
  region: string;
  logLevel: string;
  boxSubnet: string;
  /** Prefix length of each project's block of `boxSubnet` (core/netblocks.ts). */
  projectPrefix: number;
  boxOutbound: boolean;
  /** BOXHOST_BUILD_SOURCES: a base build's box reaches the node's Debian package sources (through the node's proxy) while its script runs. */
  buildSources: boolean;
  defaultBase: string;
  oidc: { issuer?: string; clientId?: string; clientSecret?: string };
  nodeId: string;
  /** BOXHOST_NODE_NAME (default: the machine's host name). */
  nodeName?: string;
  /** Overrides of what the node registers as its capacity (default: the machine's). */
  nodeCpus?: number;
  nodeRamMb?: number;
  workerConcurrency: number;
  /** Shared by the api and every node: authenticates calls to node agents. */
  clusterSecret?: string;
  agentHost: string;
  agentPort: number;
  /** The address the api uses to reach this node's agent (default: http://agentHost:port). */
  agentUrl?: string;
  /** Key prefix of every queue of the cluster in Redis. */
  redisPrefix: string;
  heartbeatMs: number;
  /** The storage watchdog (workers/storageWatchdog.ts): how often it looks (0: never), and how
   *  long the storage may give no answer before it counts as hung and is restarted. */
  storageWatchdog: { intervalMs: number; hangMs: number };
  /** The agent watchdog (workers/agentWatchdog.ts): how often a node says hello to the boxd of
   *  each running box (0: never), and how long boxd has to answer. */
  agentWatchdog: { intervalMs: number; timeoutMs: number };
  /** `zfs` commands a node runs at once per pool (workers/storage/zfsDatasets.ts). */
  zfsConcurrency: number;
  /** Host commands start from a small helper process (core/spawner.ts; BOXHOST_SPAWNER). */
  spawner: boolean;
  /** The ARC cap (MB) of a zfs-fuse daemon boxhost starts (`--max-arc-size`). */
  zfsFuseArcMb: number;
  nodeTimeoutMs: number;
  /** Days a finished operation stays readable (0: for ever; BOXHOST_OPERATIONS_KEEP_DAYS). */
  operationsKeepDays: number;
  /** What a node offers: capacity × these (docs/security.md "Admission"). */
  overcommit: { cpu: number; ram: number; storage: number };
  /** Per-project quotas unless the project has its own (PUT /v1/projects/{project}). */
  projectQuotas: { boxes: number; cpus: number; ram_mb: number; storage_gb: number; volumes: number };
  /** Requests per second per token (sustained) and the burst above it. */
  rateLimit: { rps: number; burst: number };
  /** Concurrent execs at most per box, per token and per node. */
  execLimits: { perBox: number; perToken: number; perNode: number };
  /** User snapshots one box keeps at most (BOXHOST_SNAPSHOTS_MAX_PER_BOX; 100). */
  snapshotsPerBox: number;
  /** Base imports: the upload (BOXHOST_BASE_IMPORT_MAX_BYTES; 4 GiB) and what it may unpack to
   *  (BOXHOST_BASE_MAX_GB; 16), docs/bases.md. */
  baseImport: { maxBytes: number; maxUnpackedBytes: number };
  /** Base versions a project's saves (and, apart, all imports) may hold (BOXHOST_BASES_MAX_PER_PROJECT; 100). */
  basesPerProject: number;
  /** Where data volume backups are written (BOXHOST_BACKUP_DIR; `<data dir>/backups`): point it
   *  at a mounted remote filesystem to keep backups off the machine (docs/data.md). */
  backupDir: string;
  /** A data volume's size when its create names none (BOXHOST_DATA_DEFAULT_GB; 10). */
  dataDefaultGb: number;
  /** Backups a data volume keeps at most (BOXHOST_BACKUPS_MAX_PER_VOLUME; 100). */
  backupsPerVolume: number;
  /** How long a base build's script may run (BOXHOST_BUILD_TIMEOUT_SECS; 3600). */
  buildTimeoutSecs: number;
  /** Files or directories of apt sources the `debian` base is made from (BOXHOST_DEBIAN_SOURCES,
   *  comma separated; empty: the node's own /etc/apt/sources.list and sources.list.d). */
  debianSources: string[];
  /** Extra destinations boxes never reach even with outbound on (CIDRs or addresses). */
  protectedNets: string[];
  /** Webhook deliveries (docs/packs.md "Webhooks"): networks allowed although private, and the
   *  first retry's delay (doubled at each retry). */
  webhooks: { allowNets: string[]; retryMs: number };
  /** Short tag unique to this host's data dir: keeps the runc root, pool, bridges
   *  and iptables chains of hosts that run side by side (tests) apart. */
  hostTag: string;
}

const envSchema = Joi.object({
  BOXHOST_PORT: Joi.number().integer().min(0).max(65535).default(8080),
  BOXHOST_HOST: Joi.string().default('127.0.0.1'),
  BOXHOST_DATA_DIR: Joi.string().default('./.boxhost'),
  BOXHOST_ADMIN_TOKEN: Joi.string().min(16).optional(),
  DATABASE_URL: Joi.string().uri({ scheme: ['postgres', 'postgresql', 'sqlite', 'file'] }).optional(),
  REDIS_URL: Joi.string().uri({ scheme: ['redis', 'rediss', 'unix'] }).optional(),
  BOXHOST_ZFS_POOL: Joi.string().pattern(/^[A-Za-z][A-Za-z0-9_.:-]*(\/[A-Za-z0-9_.:-]+)*$/).optional(),
  BOXHOST_POOL_SIZE_GB: Joi.number().integer().min(1).max(100000).default(20),
  BOXHOST_PUBLISH_DOMAIN: Joi.string().hostname().lowercase().default('localhost'),
  BOXHOST_PROXY_PORT: Joi.number().integer().min(0).max(65535).default(8081),
  BOXHOST_EVENT_STREAM_MAX_SECS: Joi.number().integer().min(1).max(7 * 24 * 3600).default(3600),
  BOXHOST_DEPLOY_DRAIN_SECS: Joi.number().integer().min(2).max(3600).default(10),
  BOXHOST_REGION: Joi.string().pattern(/^[a-z0-9][a-z0-9-]{0,62}$/).default('local'),
  LOG_LEVEL: Joi.string().valid('trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent').default('info'),
  // Any aligned network from /8 to /24, cut into blocks of BOXHOST_PROJECT_PREFIX (core/netblocks.ts).
  BOXHOST_BOX_SUBNET: Joi.string().default(DEFAULT_BOX_SUBNET).custom((v: string, h) => {
    const net = parseNet(v);
    return typeof net === 'string' ? h.message({ custom: net }) : `${formatIpv4(net.base)}/${net.prefix}`;
  }),
  // Unset: /22, or the subnet's own prefix when that is narrower (loadConfig).
  BOXHOST_PROJECT_PREFIX: Joi.number().integer().custom((v: number, h) => {
    const net = parseNet(String(h.state.ancestors[0].BOXHOST_BOX_SUBNET ?? DEFAULT_BOX_SUBNET));
    const min = typeof net === 'string' ? 0 : net.prefix;
    return v < min || v > MAX_PROJECT_PREFIX ? h.message({ custom: `must be from ${min} (the prefix of BOXHOST_BOX_SUBNET) to ${MAX_PROJECT_PREFIX}` }) : v;
  }).optional(),
  BOXHOST_BOX_OUTBOUND: Joi.boolean().truthy('1').falsy('0').default(false),
  BOXHOST_BUILD_SOURCES: Joi.boolean().truthy('1').falsy('0').default(true),
  BOXHOST_DEFAULT_BASE: Joi.string().default('busybox'),
  BOXHOST_OIDC_ISSUER: Joi.string().uri().optional(),
  BOXHOST_OIDC_CLIENT_ID: Joi.string().optional(),
  BOXHOST_OIDC_CLIENT_SECRET: Joi.string().optional(),
  BOXHOST_NODE_ID: Joi.string().pattern(/^[a-z0-9][a-z0-9-]{0,62}$/).default('local'),
  BOXHOST_NODE_NAME: Joi.string().max(255).optional(),
  BOXHOST_NODE_CPUS: Joi.number().integer().min(1).max(100000).optional(),
  BOXHOST_NODE_RAM_MB: Joi.number().integer().min(64).optional(),
  BOXHOST_WORKER_CONCURRENCY: Joi.number().integer().min(1).max(64).default(8),
  BOXHOST_CLUSTER_SECRET: Joi.string().min(16).optional(),
  BOXHOST_AGENT_HOST: Joi.string().default('127.0.0.1'),
  BOXHOST_AGENT_PORT: Joi.number().integer().min(0).max(65535).default(8082),
  BOXHOST_AGENT_URL: Joi.string().uri({ scheme: ['http', 'https'] }).optional(),
  BOXHOST_REDIS_PREFIX: Joi.string().pattern(/^[A-Za-z0-9:_.-]{1,64}$/).default('boxhost'),
  BOXHOST_HEARTBEAT_SECS: Joi.number().min(0.1).max(60).default(2),
  BOXHOST_STORAGE_WATCHDOG_SECS: Joi.number().min(0).max(3600).default(5),
  BOXHOST_AGENT_CHECK_SECS: Joi.number().min(0).max(3600).default(15),
  BOXHOST_AGENT_TIMEOUT_SECS: Joi.number().min(0.1).max(600).default(5),
  BOXHOST_STORAGE_HANG_SECS: Joi.number().min(1).max(3600).default(30),
  BOXHOST_ZFS_CONCURRENCY: Joi.number().integer().min(1).max(256).default(4),
  BOXHOST_SPAWNER: Joi.boolean().truthy('1').falsy('0').default(true),
  BOXHOST_ZFS_FUSE_ARC_MB: Joi.number().integer().min(16).max(16384).default(1024),
  BOXHOST_NODE_TIMEOUT_SECS: Joi.number().min(0.5).max(3600).default(10),
  BOXHOST_OPERATIONS_KEEP_DAYS: Joi.number().min(0).max(36500).default(7),
  BOXHOST_CPU_OVERCOMMIT: Joi.number().min(0.1).max(1000).default(32),
  BOXHOST_RAM_OVERCOMMIT: Joi.number().min(0.1).max(100).default(1.5),
  BOXHOST_STORAGE_OVERCOMMIT: Joi.number().min(0.1).max(1000).default(1),
  BOXHOST_PROJECT_MAX_BOXES: Joi.number().integer().min(0).default(1000),
  BOXHOST_PROJECT_MAX_CPUS: Joi.number().integer().min(0).default(1000),
  BOXHOST_PROJECT_MAX_RAM_MB: Joi.number().integer().min(0).default(1024 * 1024),
  BOXHOST_PROJECT_MAX_STORAGE_GB: Joi.number().integer().min(0).default(10 * 1024),
  BOXHOST_PROJECT_MAX_VOLUMES: Joi.number().integer().min(0).default(100),
  BOXHOST_BASE_IMPORT_MAX_BYTES: Joi.number().integer().min(1024).default(4 * 1024 ** 3),
  BOXHOST_BASES_MAX_PER_PROJECT: Joi.number().integer().min(1).max(100000).default(100),
  BOXHOST_BASE_MAX_GB: Joi.number().min(0.001).max(1024).default(16),
  BOXHOST_BACKUP_DIR: Joi.string().allow(''),
  BOXHOST_DATA_DEFAULT_GB: Joi.number().integer().min(1).max(16384).default(10),
  BOXHOST_BACKUPS_MAX_PER_VOLUME: Joi.number().integer().min(1).max(100000).default(100),
  BOXHOST_BUILD_TIMEOUT_SECS: Joi.number().integer().min(1).max(86400).default(3600),
  BOXHOST_DEBIAN_SOURCES: Joi.string().allow(''),
  BOXHOST_RATE_LIMIT_RPS: Joi.number().min(0.1).max(100000).default(50),
  BOXHOST_RATE_LIMIT_BURST: Joi.number().integer().min(1).max(1000000).default(200),
  BOXHOST_EXEC_MAX_PER_BOX: Joi.number().integer().min(1).max(100000).default(32),
  BOXHOST_SNAPSHOTS_MAX_PER_BOX: Joi.number().integer().min(1).max(10000).default(100),
  BOXHOST_EXEC_MAX_PER_TOKEN: Joi.number().integer().min(1).max(100000).default(64),
  BOXHOST_EXEC_MAX_PER_NODE: Joi.number().integer().min(1).max(100000).default(256),
  // Checked here (exit 2 naming the variable), not first at the node's start with outbound on.
  BOXHOST_PROTECTED_NETS: Joi.string().allow('').default('').custom((v: string, h) => {
    for (const c of v.split(/[\s,]+/).filter(Boolean)) {
      const why = cidrError(c);
      if (why) return h.message({ custom: why });
    }
    return v;
  }),
  BOXHOST_WEBHOOK_ALLOW_NETS: Joi.string().allow('').default('').custom((v: string, h) => {
    for (const c of v.split(/[\s,]+/).filter(Boolean)) {
      const why = cidrError(c);
      if (why) return h.message({ custom: why });
    }
    return v;
  }),
  BOXHOST_WEBHOOK_RETRY_MS: Joi.number().integer().min(10).max(3_600_000).default(2000),
}).unknown(true);

export class ConfigError extends Error {}

/** Reads and validates the environment. A bad value throws a ConfigError naming the variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, { readDotenv = true } = {}): Config {
  let source = env;
  if (readDotenv) {
    const parsed = dotenv.config({ processEnv: {}, quiet: true } as dotenv.DotenvConfigOptions).parsed ?? {};
    source = { ...parsed, ...env };
  }
  // An empty variable means "unset", as in a shell `FOO= cmd`.
  const cleaned = Object.fromEntries(Object.entries(source).filter(([, v]) => v !== ''));
  const { value, error } = envSchema.validate(cleaned, { abortEarly: true, convert: true });
  if (error) {
    const d = error.details[0];
    throw new ConfigError(`invalid ${String(d.path[0])}=${JSON.stringify(cleaned[String(d.path[0])])}: ${d.message.replace(/^"[^"]+" /, '')}`);
  }
  const dataDir = path.resolve(value.BOXHOST_DATA_DIR);
  return {
    port: value.BOXHOST_PORT,
    host: value.BOXHOST_HOST,
    dataDir,
    adminToken: value.BOXHOST_ADMIN_TOKEN,
    databaseUrl: value.DATABASE_URL,
    redisUrl: value.REDIS_URL,
    zfsPool: value.BOXHOST_ZFS_POOL,
    poolSizeGb: value.BOXHOST_POOL_SIZE_GB,
    publishDomain: value.BOXHOST_PUBLISH_DOMAIN,
    deployDrainSecs: value.BOXHOST_DEPLOY_DRAIN_SECS,
    eventStreamMaxSecs: value.BOXHOST_EVENT_STREAM_MAX_SECS,
    proxyPort: value.BOXHOST_PROXY_PORT,
    region: value.BOXHOST_REGION,
    logLevel: value.LOG_LEVEL,
    boxSubnet: value.BOXHOST_BOX_SUBNET,
    projectPrefix: value.BOXHOST_PROJECT_PREFIX ?? defaultProjectPrefix(value.BOXHOST_BOX_SUBNET),
    boxOutbound: value.BOXHOST_BOX_OUTBOUND,
    buildSources: value.BOXHOST_BUILD_SOURCES,
    defaultBase: value.BOXHOST_DEFAULT_BASE,
    oidc: {
      issuer: value.BOXHOST_OIDC_ISSUER,
      clientId: value.BOXHOST_OIDC_CLIENT_ID,
      clientSecret: value.BOXHOST_OIDC_CLIENT_SECRET,
    },
    nodeId: value.BOXHOST_NODE_ID,
    nodeName: value.BOXHOST_NODE_NAME,
    nodeCpus: value.BOXHOST_NODE_CPUS,
    nodeRamMb: value.BOXHOST_NODE_RAM_MB,
    workerConcurrency: value.BOXHOST_WORKER_CONCURRENCY,
    clusterSecret: value.BOXHOST_CLUSTER_SECRET,
    agentHost: value.BOXHOST_AGENT_HOST,
    agentPort: value.BOXHOST_AGENT_PORT,
    agentUrl: value.BOXHOST_AGENT_URL,
    redisPrefix: value.BOXHOST_REDIS_PREFIX,
    heartbeatMs: Math.round(value.BOXHOST_HEARTBEAT_SECS * 1000),
    storageWatchdog: { intervalMs: Math.round(value.BOXHOST_STORAGE_WATCHDOG_SECS * 1000), hangMs: Math.round(value.BOXHOST_STORAGE_HANG_SECS * 1000) },
    agentWatchdog: { intervalMs: Math.round(value.BOXHOST_AGENT_CHECK_SECS * 1000), timeoutMs: Math.round(value.BOXHOST_AGENT_TIMEOUT_SECS * 1000) },
    zfsConcurrency: value.BOXHOST_ZFS_CONCURRENCY,
    spawner: value.BOXHOST_SPAWNER,
    zfsFuseArcMb: value.BOXHOST_ZFS_FUSE_ARC_MB,
    nodeTimeoutMs: Math.round(value.BOXHOST_NODE_TIMEOUT_SECS * 1000),
    operationsKeepDays: value.BOXHOST_OPERATIONS_KEEP_DAYS,
    overcommit: { cpu: value.BOXHOST_CPU_OVERCOMMIT, ram: value.BOXHOST_RAM_OVERCOMMIT, storage: value.BOXHOST_STORAGE_OVERCOMMIT },
    projectQuotas: {
      boxes: value.BOXHOST_PROJECT_MAX_BOXES,
      cpus: value.BOXHOST_PROJECT_MAX_CPUS,
      ram_mb: value.BOXHOST_PROJECT_MAX_RAM_MB,
      storage_gb: value.BOXHOST_PROJECT_MAX_STORAGE_GB,
      volumes: value.BOXHOST_PROJECT_MAX_VOLUMES,
    },
    rateLimit: { rps: value.BOXHOST_RATE_LIMIT_RPS, burst: value.BOXHOST_RATE_LIMIT_BURST },
    execLimits: { perBox: value.BOXHOST_EXEC_MAX_PER_BOX, perToken: value.BOXHOST_EXEC_MAX_PER_TOKEN, perNode: value.BOXHOST_EXEC_MAX_PER_NODE },
    snapshotsPerBox: value.BOXHOST_SNAPSHOTS_MAX_PER_BOX,
    basesPerProject: value.BOXHOST_BASES_MAX_PER_PROJECT,
    backupDir: value.BOXHOST_BACKUP_DIR ? path.resolve(value.BOXHOST_BACKUP_DIR) : path.join(dataDir, 'backups'),
    dataDefaultGb: value.BOXHOST_DATA_DEFAULT_GB,
    buildTimeoutSecs: value.BOXHOST_BUILD_TIMEOUT_SECS,
    debianSources: String(value.BOXHOST_DEBIAN_SOURCES ?? '').split(',').map((s) => s.trim()).filter(Boolean).map((s) => path.resolve(s)),
    backupsPerVolume: value.BOXHOST_BACKUPS_MAX_PER_VOLUME,
    baseImport: { maxBytes: value.BOXHOST_BASE_IMPORT_MAX_BYTES, maxUnpackedBytes: Math.floor(value.BOXHOST_BASE_MAX_GB * 1024 ** 3) },
    protectedNets: String(value.BOXHOST_PROTECTED_NETS).split(/[\s,]+/).filter(Boolean),
    webhooks: { allowNets: String(value.BOXHOST_WEBHOOK_ALLOW_NETS).split(/[\s,]+/).filter(Boolean), retryMs: value.BOXHOST_WEBHOOK_RETRY_MS },
    hostTag: crypto.createHash('sha256').update(dataDir).digest('hex').slice(0, 6),
  };
}

export function ensureDataDir(config: Config): void {
  fs.mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
}
