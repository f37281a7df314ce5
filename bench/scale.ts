/**
 * Scale figures (issue 13), on a host of their own (fresh data dir, pool, subnet) started after
 * the other figures' host is gone, so neither disturbs the other:
 *
 *   - create→running of N boxes (BENCH_SCALE_BOXES, 1000) on one node through the HTTP API, as
 *     a user makes them (POST …/boxes?wait=300, then the operation wait if that runs out), in
 *     batches of 100, 10 creates in flight at a time: p50/p95 per hundred and the ratio of the
 *     last hundred's p50 to the first's (target ≤ 1.2×), with where a create's time goes per
 *     hundred (the worker's job vs the api around it, and the host steps that grew most)
 *   - listing at N boxes: every project (`GET /v1/projects/-/boxes`) and one project, each walked
 *     page by page with the api's own page size and continuation token, 20 times; and
 *     `box ls --all-projects` (the CLI, one page) a few times
 *   - host memory per idle box: used memory without the page cache and reclaimable slab
 *     (MemTotal − MemFree − Buffers − Cached − SReclaimable; caches are never dropped) before the
 *     first create and after all N run, each the median of 10 snapshots a second apart while
 *     the host idles, the difference divided by N; the zfs-fuse daemon's RSS before and after;
 *     each box's cgroup `memory.usage_in_bytes` (p50). The figure is machine-wide: whatever
 *     else runs on the machine meanwhile moves it (by ±0.2 MiB per box for ±200 MiB)
 *   - deleting them all, 20 at a time: p50/p95; then the host is closed and cleaned up
 *     (test/helpers/cleanup.ts), which reports anything left
 *
 * The boxes are the smallest the api takes (1 cpu, 64 MB, 1 GB), spread round-robin over
 * projects of at most 500 (2 for 1000), so they fit a project's address block whatever
 * BOXHOST_PROJECT_PREFIX is (a /24 holds 253, the /22 default 1021).
 *
 * On zfs-fuse there are fewer: the daemon mounts at most 1000 filesystems machine-wide (fewer if
 * its ARC is small: ROOTS_PER_ARC_MB), the host mounts 11 of its own and the node keeps 16
 * spare, so the boxes are capped as the node's admission caps them (972 on an otherwise idle
 * machine; the report says so). Past the limit a root is made but never mounted, and
 * zfs-fuse keeps it "busy" until the daemon restarts: the box, and then its pool, cannot be
 * destroyed.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { hostLogger } from './hostLog';
import type { Config } from '../core/config';
import { startHost, Host } from '../server/host';
import { cleanupHost } from '../test/helpers/cleanup';
import type { RuncRuntime } from '../workers/runtime/runc';
import { operationsRepo } from '../db/repos/operations';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import type { Profiler } from './profile';
import { fmtMs, nowMs, round1, summarize, Summary, table } from './stats';
import { Api, type CallResult } from './api';
import { ROOT_MOUNT_RESERVE } from '../workers/storage/zfs';
import { ROOTS_PER_ARC_MB, ZFS_FUSE_MAX_MOUNTS, ZfsFuseDaemon } from '../workers/storage/zfsFuse';

export interface ScaleOptions {
  /** How many boxes (> 0). */
  boxes: number;
  /** The bench's host config with these variables added. */
  makeConfig: (env: Record<string, string>) => Config;
  /** The bench's profiler (its command probe is installed once per process). */
  profiler: Profiler;
  progress: (msg: string) => void;
  /** Throws once the bench was interrupted. */
  checkpoint: () => void;
}

export interface ScaleOutcome {
  /** For the bench's JSON results, under `scale`. */
  results: Record<string, any>;
  /** Lines of the printed report. */
  report: string[];
  /** create→running samples (ms) of the first and the last hundred, for the figure table. */
  firstHundred: number[];
  lastHundred: number[];
  /** Which boxes those are: `0–100`, `900–1000`. */
  firstRange: string;
  lastRange: string;
  /** The most the last hundred's create p50 may be, in first hundred's p50s. */
  target: number;
  problems: string[];
  error?: Error;
}

const BATCH = 100;
/**
 * 10 creates in flight: a little more than the worker's 8 job slots (BOXHOST_WORKER_CONCURRENCY's
 * default, left as shipped), so the node always has a job to start while the api answers the
 * last ones, yet few enough that a create's latency is its own work (plus at most a short wait
 * for a slot) rather than the length of a queue. What the hundreds are compared on is then how a
 * create's cost grows with the boxes already there. One at a time would leave the node mostly
 * idle and take far longer; 100 at once would measure queueing.
 */
const CREATE_CONCURRENCY = 10;
/** Deletes in flight (issue 13's figure): what a person clearing a project would do. */
const DELETE_CONCURRENCY = 20;
const LIST_REPS = 20;
const CLI_REPS = 5;
const IDLE_SETTLE_MS = 10_000;
/** The smallest box the api takes (api/routes/boxes/schemas.ts: ram_mb ≥ 64). */
const SMALL = { cpus: 1, ram_mb: 64, storage_gb: 1 };
/** Boxes per project at most (issue 13: 2 projects of 500). */
const PER_PROJECT = 500;
/**
 * Creates that do not end running are counted and reported, not fatal: near the node's limits
 * some do (zfs-fuse mounts at most 1000 filesystems, machine-wide). A batch in which more than
 * this share fails ends the creating (the node takes no more); the rest is measured on the boxes
 * that run.
 */
const STOP_FAILED_SHARE = 0.5;
/** The create's target: the last hundred's p50 at most this times the first hundred's. */
const SCALE_TARGET = 1.2;
/** What a host mounts besides box roots: the pool, bases, bases/busybox, its version, boxes,
 *  data, shifted, shifted/busybox, its version (and one shifted copy per project). */
const HOST_DATASETS = 9;

/** mountinfo's filesystem types, one per mount ("… - <fstype> <source> <options>"). */
const mountTypes = () =>
  fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' - ')[1]?.split(' ')[0] ?? '');

/** FUSE filesystems mounted on the machine: zfs-fuse's datasets (`fuse.zfs`) and its
 *  /zfs-kstat (`fuse`); another FUSE filesystem only makes the count more careful. */
const fuseMounts = () => mountTypes().filter((t) => t === 'fuse' || t.startsWith('fuse.')).length;


interface Created {
  i: number;
  project: string;
  name: string;
  ms: number;
  /** 503s (no node can take a box now: its storage is being restarted) before the create went in. */
  unavailable: number;
  sentAt: number;
  answeredAt: number;
  opId: string | null;
  boxId?: string;
  error?: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const summaryJson = (s: Summary) => ({ n: s.n, p50: round1(s.p50), p95: round1(s.p95), min: round1(s.min), max: round1(s.max), mean: round1(s.mean) });
const p50p95 = (s: Summary) => `${fmtMs(s.p50)} / ${fmtMs(s.p95)}`;

async function mapLimit<T>(items: T[], limit: number, fn: (t: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(limit, queue.length) }, async () => {
      for (let it = queue.shift(); it !== undefined; it = queue.shift()) await fn(it);
    }),
  );
}

/** Waits for an operation the way `box … --wait` does when `?wait` ran out: the operation wait. */
async function waitOp(api: Api, opId: string): Promise<any> {
  for (;;) {
    const w = await api.call('GET', `/v1/operations/${opId}/wait?timeout=300`);
    if (w.status === 200) return w.body;
    if (w.status !== 408) throw new Error(`waiting for operation ${opId} answered ${w.status}: ${w.text.slice(0, 300)}`);
  }
}

/** How long a create keeps asking again while the api answers 503 (the node's storage is down). */
const UNAVAILABLE_RETRY_MS = 300_000;

/**
 * POST …/boxes?wait=300 until the box runs (request → running). A 503 (no node can take a box
 * now, e.g. while the node's storage watchdog restarts zfs-fuse) is asked again a second later
 * (or after its Retry-After), as a client would; the time counts from the first request.
 */
async function createBox(api: Api, i: number, project: string, name: string): Promise<Created> {
  const sentAt = Date.now();
  const t0 = nowMs();
  let unavailable = 0;
  let res = await api.call('POST', `/v1/projects/${project}/boxes?wait=300`, { name, config: SMALL });
  while (res.status === 503 && nowMs() - t0 < UNAVAILABLE_RETRY_MS) {
    unavailable++;
    await sleep(Math.max(1, Number(res.headers.get('retry-after')) || 1) * 1000);
    res = await api.call('POST', `/v1/projects/${project}/boxes?wait=300`, { name, config: SMALL });
  }
  const opId = res.headers.get('operation-id');
  let box = res.body;
  let error: string | undefined;
  if (res.status === 202 && opId) {
    const op = await waitOp(api, opId);
    const got = await api.call('GET', `/v1/projects/${project}/boxes/${name}`);
    box = got.body;
    if (op.status !== 'succeeded') error = `operation ${op.status}: ${op.error ?? ''}`;
  } else if (res.status !== 200) {
    error = `answered ${res.status}: ${res.text.slice(0, 300)}`;
  }
  const ms = nowMs() - t0;
  if (!error && box?.status !== 'running') error = `status ${box?.status ?? '?'}: ${box?.error ?? ''}`;
  return { i, project, name, ms, unavailable, sentAt, answeredAt: Date.now(), opId, boxId: box?.id, error };
}

/** Every box the token sees, page by page with the api's own page size. */
async function walkList(api: Api, project: string): Promise<{ ms: number; pageMs: number[]; boxes: { project: string; name: string }[] }> {
  const boxes: { project: string; name: string }[] = [];
  const pageMs: number[] = [];
  let token: string | null = null;
  const t0 = nowMs();
  do {
    const p0 = nowMs();
    const res: CallResult = await api.call('GET', `/v1/projects/${project}/boxes${token ? `?continuation_token=${encodeURIComponent(token)}` : ''}`);
    pageMs.push(nowMs() - p0);
    if (res.status !== 200) throw new Error(`listing ${project} answered ${res.status}: ${res.text.slice(0, 300)}`);
    for (const b of res.body.boxes) boxes.push({ project: b.project, name: b.name });
    token = res.body.has_more ? res.body.next_continuation_token : null;
  } while (token);
  return { ms: nowMs() - t0, pageMs, boxes };
}

/** Boxes listed as running, every project. */
async function countRunning(api: Api): Promise<number> {
  let n = 0;
  let token: string | null = null;
  do {
    const res: CallResult = await api.call('GET', `/v1/projects/-/boxes?max_results=1000${token ? `&continuation_token=${encodeURIComponent(token)}` : ''}`);
    if (res.status !== 200) throw new Error(`listing answered ${res.status}`);
    n += res.body.boxes.filter((b: any) => b.status === 'running').length;
    token = res.body.has_more ? res.body.next_continuation_token : null;
  } while (token);
  return n;
}

function runCli(args: string[], env: Record<string, string>): Promise<{ ms: number; code: number | null; out: string }> {
  const main = path.resolve(__dirname, '..', 'cli', 'main.js');
  return new Promise((resolve, reject) => {
    const t0 = nowMs();
    const child = spawn(process.execPath, [main, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (b: Buffer) => (out += b));
    child.stderr!.on('data', (b: Buffer) => (out += b));
    child.on('error', reject);
    child.on('close', (code) => resolve({ ms: nowMs() - t0, code, out }));
  });
}

// ------------------------------------------------------------------ memory

function meminfoKb(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of fs.readFileSync('/proc/meminfo', 'utf8').split('\n')) {
    const m = /^(\w+(?:\(\w+\))?):\s+(\d+)/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

function statusKb(pid: string, field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

interface MemSnapshot {
  /** MemTotal − MemFree − Buffers − Cached − SReclaimable. */
  used_no_cache_kb: number;
  /** MemTotal − MemAvailable, for comparison. */
  used_minus_available_kb: number;
  meminfo_kb: Record<string, number>;
  zfs_fuse_pids: number[];
  zfs_fuse_rss_kb: number;
  /** This process: the api and the node run in it. */
  bench_process_rss_kb: number;
  processes: number;
  /** zfs-fuse datasets mounted, machine-wide (the daemon holds at most 1000: MAX_FILESYSTEMS). */
  zfs_fuse_mounts: number;
}

function memSnapshot(): MemSnapshot {
  const mi = meminfoKb();
  const pick = ['MemTotal', 'MemFree', 'MemAvailable', 'Buffers', 'Cached', 'SReclaimable', 'SUnreclaim', 'Shmem', 'AnonPages', 'KernelStack', 'PageTables', 'Slab'];
  const zfsPids: number[] = [];
  let zfsRss = 0;
  let processes = 0;
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    processes++;
    let comm = '';
    try {
      comm = fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    } catch {
      continue;
    }
    if (comm === 'zfs-fuse') {
      zfsPids.push(Number(pid));
      zfsRss += statusKb(pid, 'VmRSS');
    }
  }
  return {
    zfs_fuse_mounts: mountTypes().filter((t) => t === 'fuse.zfs').length,
    used_no_cache_kb: mi.MemTotal - mi.MemFree - mi.Buffers - mi.Cached - mi.SReclaimable,
    used_minus_available_kb: mi.MemTotal - mi.MemAvailable,
    meminfo_kb: Object.fromEntries(pick.filter((k) => k in mi).map((k) => [k, mi[k]])),
    zfs_fuse_pids: zfsPids,
    zfs_fuse_rss_kb: zfsRss,
    bench_process_rss_kb: Math.round(process.memoryUsage().rss / 1024),
    processes,
  };
}

/** A box's cgroup (v1, memory controller): usage and the rss/cache split of memory.stat. */
function boxCgroupMemory(runtime: RuncRuntime, boxId: string): { usage: number; rss: number; cache: number } | null {
  const dir = path.join('/sys/fs/cgroup/memory', runtime.cgroupsPath(boxId));
  try {
    const usage = Number(fs.readFileSync(path.join(dir, 'memory.usage_in_bytes'), 'utf8').trim());
    const stat = Object.fromEntries(
      fs
        .readFileSync(path.join(dir, 'memory.stat'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => l.split(' '))
        .map(([k, v]) => [k, Number(v)]),
    );
    return { usage, rss: stat.total_rss ?? stat.rss ?? 0, cache: stat.total_cache ?? stat.cache ?? 0 };
  } catch {
    return null;
  }
}

/**
 * Memory after the host has idled IDLE_SETTLE_MS: one snapshot a second through it, and the one
 * with the median used memory (others work on this machine too: a compile elsewhere passing
 * through one snapshot does not decide the figure).
 */
async function settledMemory(): Promise<MemSnapshot & { used_no_cache_samples_kb: number[] }> {
  const snaps: MemSnapshot[] = [];
  for (let k = 0; k < IDLE_SETTLE_MS / 1000; k++) {
    await sleep(1000);
    snaps.push(memSnapshot());
  }
  const sorted = [...snaps].sort((a, b) => a.used_no_cache_kb - b.used_no_cache_kb);
  return { ...sorted[Math.floor((sorted.length - 1) / 2)], used_no_cache_samples_kb: snaps.map((x) => x.used_no_cache_kb) };
}

const mib = (kb: number) => kb / 1024;

/**
 * The profiler's breakdown of one phase, with the pids in host commands' labels made one
 * (`mount /proc/3551/ns/user` → `mount /proc/<pid>/ns/user`), so that a step is one row.
 */
function stepsOf(profiler: Profiler, phase: string, operations: number): { label: string; callsPerOp: number; p50: number; msPerOp: number }[] {
  const by = new Map<string, number[]>();
  for (const s of profiler.samples) {
    if (s.phase !== phase) continue;
    const label = s.label.replace(/\/proc\/\d+\//g, '/proc/<pid>/');
    if (!by.has(label)) by.set(label, []);
    by.get(label)!.push(s.ms);
  }
  return [...by.entries()]
    .map(([label, ms]) => ({ label, callsPerOp: ms.length / operations, p50: summarize(ms).p50, msPerOp: ms.reduce((a, b) => a + b, 0) / operations }))
    .sort((a, b) => b.msPerOp - a.msPerOp);
}

// ------------------------------------------------------------------ the run

export async function runScale(opts: ScaleOptions): Promise<ScaleOutcome> {
  const { profiler, progress, checkpoint } = opts;
  const startedAt = Date.now();
  // Projects of at most 500 boxes and at most what a project's address block holds.
  const probe = opts.makeConfig({});
  const projectPrefix = (probe as Partial<Record<'projectPrefix', number>>).projectPrefix ?? 24;
  const perProject = Math.min(PER_PROJECT, 2 ** (32 - projectPrefix) - 3);
  fs.rmSync(probe.dataDir, { recursive: true, force: true });
  // zfs-fuse mounts at most 1000 filesystems (all pools of the machine together); a box root past
  // that is made but cannot be mounted, and zfs-fuse then holds it "busy" until the daemon
  // restarts: neither it nor its pool can be destroyed (seen at box 988 of 1000). So the boxes
  // are kept to what the daemon has room for.
  const mountedBefore = fuseMounts();
  // The node's own arithmetic (ZfsStorage.rootLimit): what zfs-fuse mounts at most, or fewer
  // if its ARC holds fewer, less what else is mounted and the node's reserve.
  const held = Math.min(ZFS_FUSE_MAX_MOUNTS, Math.floor(new ZfsFuseDaemon({ info() {}, warn() {} }).runningArcMb() * ROOTS_PER_ARC_MB));
  const room = fs.existsSync('/dev/zfs') ? Infinity : held - mountedBefore - (HOST_DATASETS + Math.ceil(opts.boxes / perProject)) - ROOT_MOUNT_RESERVE;
  const N = Math.max(0, Math.min(opts.boxes, room));
  const capped =
    N < opts.boxes
      ? `zfs-fuse mounts at most ${held} filesystems here (${ZFS_FUSE_MAX_MOUNTS}, or ${ROOTS_PER_ARC_MB} per MB of its ARC); ${mountedBefore} FUSE filesystems were mounted before this host, which mounts ${HOST_DATASETS} + 1 per project of its own (and the node keeps ${ROOT_MOUNT_RESERVE} spare): ${N} boxes instead of ${opts.boxes}`
      : null;
  if (N < 1) {
    return { results: { boxes: N, asked: opts.boxes, error: capped }, report: [`scale: skipped: ${capped}`], firstHundred: [], lastHundred: [], firstRange: '', lastRange: '', target: SCALE_TARGET, problems: [], error: new Error(`scale: ${capped}`) };
  }
  const nProjects = Math.max(1, Math.ceil(N / perProject));
  const config = opts.makeConfig({
    // Admission must take N of the smallest boxes: 1 cpu each (cpus × 1000 ≥ N on 2 cpus up to
    // 2000 boxes; past that the node claims N cpus), 64 MB each on RAM × 100, 1 GB each on the
    // 20 GB sparse pool × 1000.
    BOXHOST_CPU_OVERCOMMIT: '1000',
    ...(N > os.cpus().length * 1000 ? { BOXHOST_NODE_CPUS: String(N) } : {}),
    BOXHOST_RAM_OVERCOMMIT: '100',
    BOXHOST_POOL_SIZE_GB: '20',
    BOXHOST_STORAGE_OVERCOMMIT: '1000',
    BOXHOST_PROJECT_MAX_BOXES: String(perProject),
    BOXHOST_PROJECT_MAX_CPUS: String(perProject * SMALL.cpus),
    BOXHOST_PROJECT_MAX_RAM_MB: String(perProject * SMALL.ram_mb),
    BOXHOST_PROJECT_MAX_STORAGE_GB: String(perProject * SMALL.storage_gb),
    // The list repetitions page quickly: the bench measures latency, not the rate limiter.
    BOXHOST_RATE_LIMIT_RPS: '100000',
    BOXHOST_RATE_LIMIT_BURST: '1000000',
  });
  const projects = Array.from({ length: nProjects }, (_, p) => `scale-${p}`);
  const projectOf = (i: number) => projects[i % nProjects];
  const nameOf = (i: number) => `s${String(i).padStart(String(N).length, '0')}`;

  // The host's log: only the operations' lines are kept (for where a create's time goes);
  // warnings also go to stderr.
  const keep = new Set(['operation running', 'operation succeeded', 'operation step failed']);
  /** The node's storage watchdog at work (docs/decisions.md "Storage watchdog"): when, what. */
  const storageEvents: { time: number; msg: string }[] = [];
  const opLog = new Map<string, { running?: number; succeeded?: number; retries: number }>();
  const warnings: string[] = [];
  let warningCount = 0;
  const log = hostLogger('info', (e, line) => {
    if (e.op && keep.has(e.msg)) {
      const o = opLog.get(e.op) ?? { retries: 0 };
      if (e.msg === 'operation running') o.running ??= e.time;
      if (e.msg === 'operation succeeded') o.succeeded = e.time;
      if (e.msg === 'operation step failed') o.retries++;
      opLog.set(e.op, o);
    }
    if (e.part === 'storage-watchdog' || e.part === 'storage-recovery' || e.msg === 'killed the zfs-fuse daemon') storageEvents.push({ time: e.time, msg: e.msg });
    if (e.level >= 40 && profiler.phase !== 'teardown') {
      if (warnings.length < 20) warnings.push(`${e.msg}${e.err ? `: ${String(e.err.message ?? e.err).slice(0, 200)}` : ''}`);
      warningCount++;
      process.stderr.write(`[scale host] ${line}\n`);
    }
  });

  const results: Record<string, any> = {
    boxes: N,
    asked: opts.boxes,
    capped,
    fuse_mounts_before: mountedBefore,
    projects: nProjects,
    boxes_per_project: Math.ceil(N / nProjects),
    project_prefix: projectPrefix,
    box_config: SMALL,
    batch: BATCH,
    create_concurrency: CREATE_CONCURRENCY,
    delete_concurrency: DELETE_CONCURRENCY,
    data_dir: config.dataDir,
    box_subnet: config.boxSubnet,
  };
  const report: string[] = [];
  const problems: string[] = [];
  const created: Created[] = [];
  let host: Host | undefined;
  let api: Api | undefined;
  let error: Error | undefined;

  try {
    progress(`scale: starting a host in ${config.dataDir} for ${N} boxes in ${nProjects} project${nProjects === 1 ? '' : 's'} (${results.boxes_per_project} each, project block /${projectPrefix})`);
    host = await startHost(config, { roles: ['api', 'node'], log });
    api = new Api(host.url!, host.adminToken);
    const ctx = host.node!.ctx;
    const runtime = ctx.runtime as RuncRuntime;
    profiler.wrap(ctx.storage, 'storage', ['createBoxRoot', 'prepareBoxRoot', 'destroyBoxRoot']);
    profiler.wrap(ctx.network, 'network', ['attach', 'detach', 'releaseProject']);
    profiler.wrap(ctx.runtime, 'runtime', ['start', 'ownsNetns', 'makeNetns', 'writeEnvironment', 'remove', 'stop', 'status']);
    // Module objects: wrapped once per process (the other figures' run may have done it).
    profiler.wrap(operationsRepo, 'db operations', ['get', 'insert', 'update', 'earlierUnfinished']);
    profiler.wrap(boxesRepo, 'db boxes', Object.keys(boxesRepo));
    profiler.wrap(projectsRepo, 'db projects', Object.keys(projectsRepo));
    if (host.api) profiler.wrap(host.api.queue, 'api queue', ['enqueue', 'waitFor']);

    // ------------------------------------------------------------ memory before
    profiler.phase = 'scale-settle';
    const memBefore = await settledMemory();
    results.memory_before = memBefore;

    // ------------------------------------------------------------ creates
    const hundreds: { from: number; to: number; wallMs: number; samples: Created[]; startedAt: number; endedAt: number }[] = [];
    let stoppedEarly: string | null = null;
    for (let from = 0; from < N; from += BATCH) {
      checkpoint();
      const to = Math.min(N, from + BATCH);
      const h = hundreds.length;
      profiler.phase = `scale-create-${h}`;
      const samples: Created[] = [];
      const w0 = nowMs();
      const startedAtH = Date.now();
      await mapLimit(
        Array.from({ length: to - from }, (_, k) => from + k),
        CREATE_CONCURRENCY,
        async (i) => {
          const c = await createBox(api!, i, projectOf(i), nameOf(i));
          samples.push(c);
          if (c.error) progress(`scale: create ${c.project}/${c.name} did not end running: ${c.error}`);
        },
      );
      hundreds.push({ from, to, wallMs: nowMs() - w0, samples, startedAt: startedAtH, endedAt: Date.now() });
      created.push(...samples);
      const s = summarize(samples.map((c) => c.ms));
      progress(`scale: boxes ${from}–${to}: create p50 ${fmtMs(s.p50)} ms, p95 ${fmtMs(s.p95)} ms, ${((to - from) / ((nowMs() - w0) / 1000)).toFixed(1)} boxes/s, load ${os.loadavg()[0].toFixed(1)}`);
      const failed = samples.filter((c) => c.error).length;
      if (failed > samples.length * STOP_FAILED_SHARE) {
        stoppedEarly = `${failed} of the ${samples.length} creates of boxes ${from}–${to} did not end running: no more are made`;
        progress(`scale: ${stoppedEarly}`);
        break;
      }
    }
    if (!created.some((c) => !c.error)) throw new Error(`no create ended running: ${created[0]?.error ?? 'none made'}`);
    results.create_stopped_early = stoppedEarly;
    const ok = created.filter((c) => !c.error);
    results.create_failures = created.filter((c) => c.error).map((c) => `${c.project}/${c.name}: ${c.error}`);

    const phaseOf = (c: Created) => {
      const o = c.opId ? opLog.get(c.opId) : undefined;
      return o?.running && o.succeeded ? { toJob: o.running - c.sentAt, job: o.succeeded - o.running, afterJob: c.answeredAt - o.succeeded, retries: o.retries } : null;
    };
    const perHundred = hundreds.map((hd, h) => {
      const good = hd.samples.filter((c) => !c.error);
      const ph = good.map(phaseOf).filter((p): p is NonNullable<typeof p> => p !== null);
      return {
        range: `${hd.from}–${hd.to}`,
        create: summarize(good.map((c) => c.ms)),
        to_job: summarize(ph.map((p) => p.toJob)),
        job: summarize(ph.map((p) => p.job)),
        after_job: summarize(ph.map((p) => p.afterJob)),
        retries: ph.reduce((a, p) => a + p.retries, 0),
        failures: hd.samples.length - good.length,
        asked_again_after_503: hd.samples.filter((c) => c.unavailable > 0).length,
        storage_restarts: storageEvents.filter((ev) => ev.time >= hd.startedAt && ev.time <= hd.endedAt && ev.msg === 'killed the zfs-fuse daemon').length,
        boxes_per_s: hd.samples.length / (hd.wallMs / 1000),
        steps: stepsOf(profiler, `scale-create-${h}`, hd.samples.length),
      };
    });
    const first = perHundred[0];
    const last = perHundred[perHundred.length - 1];
    const ratio = last.create.p50 / first.create.p50;
    results.create = {
      per_hundred: perHundred.map((p) => ({
        range: p.range,
        create: summaryJson(p.create),
        request_to_job_running: summaryJson(p.to_job),
        job_running_to_succeeded: summaryJson(p.job),
        job_succeeded_to_answer: summaryJson(p.after_job),
        job_retries: p.retries,
        failures: p.failures,
        asked_again_after_503: p.asked_again_after_503,
        storage_restarts: p.storage_restarts,
        boxes_per_s: round1(p.boxes_per_s),
      })),
      last_over_first_p50: Math.round(ratio * 100) / 100,
      target: SCALE_TARGET,
      result: ratio <= SCALE_TARGET ? 'PASS' : 'MISS',
      all: summaryJson(summarize(ok.map((c) => c.ms))),
      wall_s: round1(hundreds.reduce((a, hd) => a + hd.wallMs, 0) / 1000),
    };
    // The host steps whose time per create grew the most from the first hundred to the last.
    const firstSteps = new Map(first.steps.map((s) => [s.label, s]));
    const lastSteps = new Map(last.steps.map((s) => [s.label, s]));
    const growth = [...new Set([...firstSteps.keys(), ...lastSteps.keys()])]
      .map((label) => {
        const a = firstSteps.get(label);
        const b = lastSteps.get(label);
        return { label, first_ms_per_op: round1(a?.msPerOp ?? 0), last_ms_per_op: round1(b?.msPerOp ?? 0), first_p50: round1(a?.p50 ?? NaN), last_p50: round1(b?.p50 ?? NaN), calls_per_op_last: round1(b?.callsPerOp ?? 0) };
      })
      .sort((x, y) => y.last_ms_per_op - y.first_ms_per_op - (x.last_ms_per_op - x.first_ms_per_op));
    results.create.step_growth = growth;
    results.create.steps_per_hundred = perHundred.map((p) => ({ range: p.range, steps: p.steps.slice(0, 16).map((s) => ({ label: s.label, calls_per_op: round1(s.callsPerOp), p50: round1(s.p50), ms_per_op: round1(s.msPerOp) })) }));

    // ------------------------------------------------------------ memory after, idle
    checkpoint();
    profiler.phase = 'scale-idle';
    // After a storage restart the node starts its boxes again, 4 at a time: memory is measured
    // once it is done (the node's storage check "ok" and every box made running).
    const calm0 = nowMs();
    for (;;) {
      const node = await api.call('GET', '/v1/nodes/local');
      const listed = await walkList(api, '-').catch(() => null);
      const notRunning = listed ? listed.boxes.length - (await countRunning(api)) : -1;
      // Creates that failed keep their row (status failed); one refused up front made none.
      if (node.body?.storage === 'ok' && notRunning === created.filter((c) => c.error && c.opId !== null).length) break;
      if (nowMs() - calm0 > 600_000) {
        problems.push(`the node did not settle within 10 min (storage ${node.body?.storage}, ${notRunning} boxes not running)`);
        break;
      }
      await sleep(2000);
    }
    results.settle_before_memory_s = round1((nowMs() - calm0) / 1000);
    progress(`scale: ${ok.length} boxes running; idling ${IDLE_SETTLE_MS / 1000} s before measuring memory`);
    const memAfter = await settledMemory();
    const cg = ok.map((c) => (c.boxId ? boxCgroupMemory(runtime, c.boxId) : null)).filter((x): x is NonNullable<typeof x> => x !== null);
    const n = ok.length || 1;
    results.memory_after = memAfter;
    results.memory = {
      used_no_cache_per_box_kb: round1((memAfter.used_no_cache_kb - memBefore.used_no_cache_kb) / n),
      used_minus_available_per_box_kb: round1((memAfter.used_minus_available_kb - memBefore.used_minus_available_kb) / n),
      zfs_fuse_rss_before_kb: memBefore.zfs_fuse_rss_kb,
      zfs_fuse_rss_after_kb: memAfter.zfs_fuse_rss_kb,
      zfs_fuse_rss_per_box_kb: round1((memAfter.zfs_fuse_rss_kb - memBefore.zfs_fuse_rss_kb) / n),
      // The daemon's ARC grows and shrinks with what was read before (a bench or soak just
      // before this one leaves it full): the machine-wide figure moves with it. Without it:
      used_no_cache_without_zfs_fuse_per_box_kb: round1((memAfter.used_no_cache_kb - memBefore.used_no_cache_kb - (memAfter.zfs_fuse_rss_kb - memBefore.zfs_fuse_rss_kb)) / n),
      bench_process_rss_per_box_kb: round1((memAfter.bench_process_rss_kb - memBefore.bench_process_rss_kb) / n),
      processes_per_box: round1((memAfter.processes - memBefore.processes) / n),
      kernel_per_box_kb: Object.fromEntries(
        ['SUnreclaim', 'KernelStack', 'PageTables', 'Shmem', 'AnonPages'].map((k) => [k, round1(((memAfter.meminfo_kb[k] ?? 0) - (memBefore.meminfo_kb[k] ?? 0)) / n)]),
      ),
      cgroups_read: cg.length,
      cgroup_usage_bytes: summaryJson(summarize(cg.map((x) => x.usage))),
      cgroup_rss_bytes: summaryJson(summarize(cg.map((x) => x.rss))),
      cgroup_cache_bytes: summaryJson(summarize(cg.map((x) => x.cache))),
      cgroup_usage_sum_kb: Math.round(cg.reduce((a, x) => a + x.usage, 0) / 1024),
    };

    // ------------------------------------------------------------ lists at N boxes
    checkpoint();
    profiler.phase = 'scale-list';
    progress(`scale: listing: every project and project ${projects[0]}, page by page, ${LIST_REPS} times each (after a warm-up)`);
    const all = await walkList(api, '-');
    // A create refused up front (503 after the retries) made no row; one that failed keeps its row.
    const made = created.filter((c) => c.opId !== null).length;
    if (all.boxes.length !== made) problems.push(`the list of every project had ${all.boxes.length} boxes, ${made} were made`);
    const one = await walkList(api, projects[0]);
    const allRuns: Awaited<ReturnType<typeof walkList>>[] = [];
    const oneRuns: Awaited<ReturnType<typeof walkList>>[] = [];
    for (let r = 0; r < LIST_REPS; r++) {
      checkpoint();
      allRuns.push(await walkList(api, '-'));
      oneRuns.push(await walkList(api, projects[0]));
    }
    const cliEnv = { BOXHOST_URL: api.url, BOXHOST_TOKEN: api.token };
    const cliRuns: number[] = [];
    let cliNote = '';
    await runCli(['ls', '--all-projects'], cliEnv);
    for (let r = 0; r < CLI_REPS; r++) {
      const c = await runCli(['ls', '--all-projects'], cliEnv);
      if (c.code !== 0) {
        cliNote = `box ls --all-projects exited ${c.code}: ${c.out.slice(0, 300)}`;
        break;
      }
      cliRuns.push(c.ms);
    }
    const cliVersion: number[] = [];
    for (let r = 0; r < CLI_REPS && !cliNote; r++) cliVersion.push((await runCli(['--version'], cliEnv)).ms);
    results.list = {
      all_projects: { boxes: all.boxes.length, pages: all.pageMs.length, walk: summaryJson(summarize(allRuns.map((r) => r.ms))), page: summaryJson(summarize(allRuns.flatMap((r) => r.pageMs))) },
      one_project: { project: projects[0], boxes: one.boxes.length, pages: one.pageMs.length, walk: summaryJson(summarize(oneRuns.map((r) => r.ms))), page: summaryJson(summarize(oneRuns.flatMap((r) => r.pageMs))) },
      cli_ls_all_projects: cliNote ? { error: cliNote } : { runs: summaryJson(summarize(cliRuns)), cli_start_only: summaryJson(summarize(cliVersion)) },
    };

    // ------------------------------------------------------------ deletes
    checkpoint();
    const nodeRow = await api.call('GET', '/v1/nodes/local');
    results.node_storage_restarts = nodeRow.body?.storage_restarts ?? null;
    profiler.phase = 'scale-delete';
    const toDelete = all.boxes;
    progress(`scale: deleting ${toDelete.length} boxes, ${DELETE_CONCURRENCY} at a time`);
    const deletes: number[] = [];
    const d0 = nowMs();
    let deleted = 0;
    await mapLimit(toDelete, DELETE_CONCURRENCY, async (b) => {
      const t0 = nowMs();
      const res = await api!.call('DELETE', `/v1/projects/${b.project}/boxes/${b.name}?wait=300`);
      let ok = res.status === 204 || res.status === 404;
      if (res.status === 202) {
        const opId = res.headers.get('operation-id');
        if (opId) ok = (await waitOp(api!, opId)).status === 'succeeded';
      }
      if (!ok) problems.push(`delete ${b.project}/${b.name} answered ${res.status}: ${res.text.slice(0, 200)}`);
      else deletes.push(nowMs() - t0);
      if (++deleted % 100 === 0) progress(`scale: ${deleted} deleted, p50 so far ${fmtMs(summarize(deletes).p50)} ms`);
    });
    const deleteWall = nowMs() - d0;
    const rest = await walkList(api, '-');
    if (rest.boxes.length) problems.push(`${rest.boxes.length} boxes still listed after the deletes`);
    results.delete = { deleted: deletes.length, latency: summaryJson(summarize(deletes)), wall_s: round1(deleteWall / 1000), left_listed: rest.boxes.length, steps: stepsOf(profiler, 'scale-delete', Math.max(1, deletes.length)).slice(0, 12).map((s) => ({ label: s.label, calls_per_op: round1(s.callsPerOp), p50: round1(s.p50), ms_per_op: round1(s.msPerOp) })) };
    progress(`scale: deletes done: p50 ${fmtMs(results.delete.latency.p50)} ms in ${results.delete.wall_s} s`);

    // ------------------------------------------------------------ report
    const m = results.memory;
    const rows = [['boxes', 'create p50 / p95 (ms)', 'vs first p50', 'request→job p50', 'job p50 / p95', 'job done→answer p50', 'boxes/s', '']];
    for (const p of perHundred) {
      rows.push([
        p.range,
        p50p95(p.create),
        `${(p.create.p50 / first.create.p50).toFixed(2)}x`,
        fmtMs(p.to_job.p50),
        p50p95(p.job),
        fmtMs(p.after_job.p50),
        p.boxes_per_s.toFixed(1),
        [p.failures ? `${p.failures} failed` : '', p.retries ? `${p.retries} job retries` : '', p.asked_again_after_503 ? `${p.asked_again_after_503} asked again after 503` : '', p.storage_restarts ? `zfs-fuse restarted by the watchdog ×${p.storage_restarts}` : ''].filter(Boolean).join(', '),
      ]);
    }
    report.push(`scale: ${N} boxes (${SMALL.cpus} cpu, ${SMALL.ram_mb} MB, ${SMALL.storage_gb} GB) on one node in ${nProjects} project${nProjects === 1 ? '' : 's'}, created ${BATCH} per batch, ${CREATE_CONCURRENCY} at a time through the API (?wait), in ${results.create.wall_s} s`);
    report.push(table(rows));
    report.push(`create p50, last hundred / first hundred: ${fmtMs(last.create.p50)} / ${fmtMs(first.create.p50)} ms = ${ratio.toFixed(2)}x (target <= ${SCALE_TARGET}x): ${ratio <= SCALE_TARGET ? 'PASS' : 'MISS'}`);
    const grow = [['host step (per create)', `${first.range} ms/op`, `${last.range} ms/op`, 'growth', `p50 per call ${first.range} → ${last.range}`]];
    for (const g of growth.slice(0, 8)) grow.push([g.label, fmtMs(g.first_ms_per_op), fmtMs(g.last_ms_per_op), `${(g.last_ms_per_op - g.first_ms_per_op).toFixed(1)}`, `${fmtMs(g.first_p50)} → ${fmtMs(g.last_p50)}`]);
    report.push(`where the create time grew (the steps with the most added ms per create; methods include their commands):\n${table(grow)}`);
    const L = results.list;
    const other = [['at scale', 'p50 / p95', 'detail']];
    other.push([`list every project (${L.all_projects.pages} pages)`, p50p95(summarize(allRuns.map((r) => r.ms))) + ' ms', `${L.all_projects.boxes} boxes; per page ${p50p95(summarize(allRuns.flatMap((r) => r.pageMs)))} ms; ${LIST_REPS} walks`]);
    other.push([`list one project (${L.one_project.pages} pages)`, p50p95(summarize(oneRuns.map((r) => r.ms))) + ' ms', `${L.one_project.boxes} boxes; per page ${p50p95(summarize(oneRuns.flatMap((r) => r.pageMs)))} ms; ${LIST_REPS} walks`]);
    if (!cliNote) other.push(['box ls --all-projects (CLI, 1 page)', p50p95(summarize(cliRuns)) + ' ms', `the CLI's own start (box --version): p50 ${fmtMs(summarize(cliVersion).p50)} ms; ${CLI_REPS} runs`]);
    other.push(['host memory per idle box', `${mib(m.used_no_cache_per_box_kb).toFixed(2)} MiB`, `used without cache ${mib(memBefore.used_no_cache_kb).toFixed(0)} → ${mib(memAfter.used_no_cache_kb).toFixed(0)} MiB over ${ok.length} boxes (MemTotal−MemAvailable: ${mib(m.used_minus_available_per_box_kb).toFixed(2)} MiB/box; without zfs-fuse's RSS change: ${mib(m.used_no_cache_without_zfs_fuse_per_box_kb).toFixed(2)} MiB/box)`]);
    other.push(['zfs-fuse RSS', `${mib(memBefore.zfs_fuse_rss_kb).toFixed(0)} → ${mib(memAfter.zfs_fuse_rss_kb).toFixed(0)} MiB`, `${m.zfs_fuse_rss_per_box_kb} KiB per box; filesystems mounted ${memBefore.zfs_fuse_mounts} → ${memAfter.zfs_fuse_mounts}${results.node_storage_restarts ? ' (the daemon was restarted in between: its RSS started afresh)' : ''}`]);
    other.push(['box cgroup memory.usage_in_bytes', `${(m.cgroup_usage_bytes.p50 / 1024).toFixed(0)} / ${(m.cgroup_usage_bytes.p95 / 1024).toFixed(0)} KiB`, `rss p50 ${(m.cgroup_rss_bytes.p50 / 1024).toFixed(0)} KiB, cache p50 ${(m.cgroup_cache_bytes.p50 / 1024).toFixed(0)} KiB; ${m.cgroups_read} cgroups, ${(m.cgroup_usage_sum_kb / 1024).toFixed(0)} MiB in all`]);
    other.push(['per box, elsewhere', `${m.processes_per_box} processes`, `bench process (api + node) RSS ${m.bench_process_rss_per_box_kb} KiB/box; kernel: ${Object.entries(m.kernel_per_box_kb).map(([k, v]) => `${k} ${v} KiB`).join(', ')}`]);
    other.push([`delete (${DELETE_CONCURRENCY} at a time)`, p50p95(summarize(deletes)) + ' ms', `${deletes.length} boxes in ${results.delete.wall_s} s`]);
    report.push(table(other));
    if (capped) report.push(`note: ${capped}`);
    if (stoppedEarly) report.push(`note: creating stopped early: ${stoppedEarly}`);
    const failedCreates = created.filter((c) => c.error);
    if (failedCreates.length) report.push(`note: ${failedCreates.length} of ${created.length} creates did not end running (first: ${failedCreates[0].project}/${failedCreates[0].name}: ${failedCreates[0].error}); zfs-fuse filesystems mounted at the end: ${memAfter.zfs_fuse_mounts} (its limit: 1000)`);
    if (results.node_storage_restarts) report.push(`note: the node's storage watchdog restarted zfs-fuse ${results.node_storage_restarts} time(s) during the scale run`);
    results.host_warnings = { count: warningCount, first: warnings };
    if (warningCount) report.push(`note: the scale host logged ${warningCount} warnings (on stderr), first: ${warnings[0]}`);
    results.storage_events = storageEvents.map((ev) => ({ at_s: round1((ev.time - startedAt) / 1000), msg: ev.msg }));
    results.first_hundred = first.create;
    results.last_hundred = last.create;
    return finish(
      hundreds[0].samples.filter((c) => !c.error).map((c) => c.ms),
      hundreds[hundreds.length - 1].samples.filter((c) => !c.error).map((c) => c.ms),
      first.range,
      last.range,
    );
  } catch (e) {
    error = e as Error;
    progress(`scale: ${error.message}`);
    return finish([], [], '', '');
  }

  async function finish(firstHundred: number[], lastHundred: number[], firstRange: string, lastRange: string): Promise<ScaleOutcome> {
    profiler.phase = 'teardown';
    const step = async (what: string, fn: () => Promise<unknown>) => {
      try {
        await fn();
      } catch (e) {
        problems.push(`${what}: ${(e as Error).message}`);
      }
    };
    if (error && api) {
      // The normal path deleted every box; after an error whatever is there goes the same way.
      const a = api;
      await step('delete boxes', async () => {
        const left = (await walkList(a, '-')).boxes;
        progress(`scale teardown: deleting ${left.length} boxes through the API`);
        await mapLimit(left, DELETE_CONCURRENCY, async (b) => {
          const r = await a.call('DELETE', `/v1/projects/${b.project}/boxes/${b.name}?wait=300`).catch((err) => ({ status: 0, text: String(err) }) as CallResult);
          if (![204, 404].includes(r.status)) problems.push(`delete ${b.project}/${b.name} answered ${r.status}: ${r.text.slice(0, 200)}`);
        });
      });
    }
    if (host) {
      const h = host;
      await step('host close', () => h.close());
    }
    await step('cleanupHost', async () => problems.push(...(await cleanupHost(config))));
    results.cleanup_problems = problems;
    results.error = error ? error.message : null;
    results.duration_s = round1((Date.now() - startedAt) / 1000);
    return { results, report, firstHundred, lastHundred, firstRange, lastRange, target: SCALE_TARGET, problems, error };
  }
}
