/**
 * The soak: rounds of box lifecycles on one real host (api + node in this process, a temp data
 * dir, the embedded sqlite, Redis and loop-file pool), driven only through the HTTP API, then
 * checked: every operation ended, every box where it should be, no failed operation the soak
 * did not ask for, nothing of a deleted box left on the machine, /healthz 200.
 *
 * One round (boxes `r<round>-b<i>`, spread over the projects):
 *   - creates at `createConcurrency`; each box, once running, goes through its script while
 *     other boxes are still being created (`workConcurrency` scripts at a time): an exec whose
 *     output is checked; for some a file written and synced; a failing exec (exit 7), a command
 *     that does not exist, an exec killed by its timeout, a 64 KiB output; a fork (of a running
 *     source, or of a stopped one) whose copy of the file is checked; a stop, a refused exec in
 *     the stopped box (409), a resume and the file checked again; one create of a taken name
 *     (409). The failures the soak provokes are counted apart and never fail it.
 *   - every box listed with the status it should have (running or stopped);
 *   - deletes of every box of the round at `deleteConcurrency`, while the long-lived "keeper"
 *     boxes (made before round 1, deleted after the last) are exec'd into all along: their file,
 *     written and synced at the start, must read back at every exec;
 *   - checks: operations (none unfinished, none failed), the listing (keepers only), leftovers
 *     on the machine, /healthz, what the storage watchdog logged.
 * After the last round: the keepers are deleted and nothing of any box may be left.
 *
 * Its client waits out a 429, and a 503 with Retry-After (a node restarting its storage says
 * so). An error of a call that overlapped a storage outage the watchdog reported and mended
 * (from the unanswered looks to its "storage recovered", ±10 s) is counted in `during_outage`,
 * not as a failure: the soak shows that the node heals, not that nothing fails while its
 * storage is down. An outage it did not mend excuses nothing.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { hostLogger } from '../bench/hostLog';
import { loadConfig, Config } from '../core/config';
import { startHost, Host } from '../server/host';
import { cleanupHost } from '../test/helpers/cleanup';
import { round1, summarize, Summary, nowMs } from '../bench/stats';
import type { ZfsStorage } from '../workers/storage/zfs';
import { SoakApi, CallResult, mapLimit, sleep } from './client';
import { describeLeftovers, findLeftovers, leftoverCount, Leftovers } from './leftovers';

export interface SoakOptions {
  rounds: number;
  boxesPerRound: number;
  createConcurrency: number;
  /** Box scripts (execs, forks, stops, resumes) running at once. */
  workConcurrency: number;
  deleteConcurrency: number;
  projects: number;
  /** Long-lived boxes exec'd into during every round's deletes. */
  keepers: number;
  /** Every n-th box is forked (0: none). */
  forkEvery: number;
  /** Every n-th box is stopped, every other one of those resumed (0: none). */
  stopEvery: number;
  /** No new round starts, and no more boxes of the round under way are created, after this (0: none). */
  durationLimitS: number;
  /** An operation unfinished this long after it was queued is stuck. */
  opBoundS: number;
  seed: number;
  /** Extra host environment (on top of the soak's). */
  env?: Record<string, string>;
  progress?: (msg: string) => void;
  /** Asked between steps: true stops the soak early (it still deletes and checks). */
  interrupted?: () => boolean;
}

export const DEFAULT_OPTIONS: SoakOptions = {
  rounds: 3,
  boxesPerRound: 200,
  createConcurrency: 10,
  workConcurrency: 10,
  deleteConcurrency: 20,
  projects: 2,
  keepers: 3,
  forkEvery: 10,
  stopEvery: 5,
  durationLimitS: 0,
  opBoundS: 300,
  seed: 1,
};

export interface LatencyJson {
  n: number;
  p50: number;
  p95: number;
  max: number;
}

export interface RoundResult {
  round: number;
  started_at: string;
  duration_s: number;
  counts: Record<string, number>;
  latency_ms: Record<string, LatencyJson>;
  /** Unexpected: each fails the soak. kind → count. */
  errors: Record<string, number>;
  /** Asked for by the soak: never fail it. kind → count. */
  provoked: Record<string, number>;
  /** Steps a job retried (its operation may still have succeeded): message → count. */
  job_retries: Record<string, number>;
  /** Operations by kind: count and the longest queued→ended, from the db. */
  operations: Record<string, { n: number; failed: number; max_ms: number }>;
  /** What the storage watchdog (or any storage recovery) logged during the round. */
  watchdog: string[];
  /** Errors of calls that overlapped a storage outage the watchdog mended (not failures). */
  during_outage: Record<string, number>;
  leftovers: Record<string, string[]>;
  healthz: { status: number; waited_s: number };
  /** Every failed check, with up to a few examples each. */
  failures: string[];
}

export interface SoakResult {
  started_at: string;
  duration_s: number;
  options: Omit<SoakOptions, 'progress' | 'interrupted' | 'env'>;
  machine: { cpus: number; ram_mb: number; kernel: string; loadavg_start: number[]; loadavg_end?: number[] };
  host: { data_dir: string; host_tag: string; start_s: number; storage_log?: string[] };
  rounds: RoundResult[];
  final: {
    keepers_deleted: number;
    leftovers: Record<string, string[]>;
    leftovers_unchecked: string[];
    healthz: { status: number; waited_s: number };
    watchdog: string[];
    watchdog_metrics: string[];
    failures: string[];
  };
  interrupted: boolean;
  /** Set when the soak itself could not run to the end. */
  error: string | null;
  /** Every failure of every round and of the end: the soak passed iff empty. */
  failures: string[];
  cleanup_problems: string[];
}

/** The host a soak runs: the embedded defaults on a temp data dir, watchdog untouched. */
export function soakConfig(env: Record<string, string> = {}): Config {
  const base = os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir();
  return loadConfig(
    {
      BOXHOST_DATA_DIR: fs.mkdtempSync(path.join(base, 'bh-soak-')),
      BOXHOST_PORT: '0',
      LOG_LEVEL: 'info',
      BOXHOST_BOX_SUBNET: `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`,
      BOXHOST_ADMIN_TOKEN: crypto.randomBytes(24).toString('hex'),
      // Hundreds of small boxes at once on a 2-core machine with a sparse 20 GB pool: admission
      // is not what the soak is about (it has its own tests), so it promises more than that.
      BOXHOST_CPU_OVERCOMMIT: '1000',
      BOXHOST_STORAGE_OVERCOMMIT: '1000',
      BOXHOST_RAM_OVERCOMMIT: '100',
      ...env,
    },
    { readDotenv: false },
  );
}

/** Small boxes: a soak box runs `sleep` and a few execs. */
const BOX_CONFIG = { cpus: 1, ram_mb: 128, storage_gb: 1 };

/** A log line that says the storage watchdog (or anything) noticed or recovered the storage. */
/** How far around a mended storage outage an error still counts as the outage's. */
const OUTAGE_MARGIN_MS = 10_000;
const WATCHDOG_RE = /watchdog|storage.*(restart|recover|hung|dead|remount|stuck)|zfs-fuse.*(restart|kill|start)|(restart|recover).*(storage|zfs)/i;

type Expected = 'running' | 'stopped' | 'gone';

interface SoakBox {
  name: string;
  project: string;
  id?: string;
  expected: Expected;
  /** Content of /root/soak when the soak wrote one. */
  file?: string;
  /** A box on which a state change failed: not judged again for its state. */
  broken?: boolean;
}

/** mulberry32: a small seeded generator, so a run's shuffles can be replayed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffle<T>(items: T[], rand: () => number): T[] {
  const a = [...items];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

const latencyJson = (s: Summary): LatencyJson => ({ n: s.n, p50: round1(s.p50), p95: round1(s.p95), max: round1(s.max) });

/** Per round: samples, counts and failures, by kind. */
class Tally {
  readonly samples: Record<string, number[]> = {};
  readonly counts: Record<string, number> = {};
  readonly errors: Record<string, number> = {};
  readonly provoked: Record<string, number> = {};
  readonly examples: Record<string, string[]> = {};

  sample(kind: string, ms: number) {
    (this.samples[kind] ??= []).push(ms);
  }
  count(kind: string, n = 1) {
    this.counts[kind] = (this.counts[kind] ?? 0) + n;
  }
  provoke(kind: string) {
    this.provoked[kind] = (this.provoked[kind] ?? 0) + 1;
  }
  /** When each error's call ran (epoch ms), to tell the ones inside a storage outage. */
  readonly spans: { kind: string; start: number; end: number }[] = [];
  /** Errors of calls that overlapped a storage outage the watchdog reported and mended. */
  readonly duringOutage: Record<string, number> = {};

  /** `start`: when the API call that failed began; only such errors can be excused, never the
   *  checks' (a box left in the wrong state, an operation stuck, a leftover, /healthz). */
  error(kind: string, detail: string, start?: number) {
    this.errors[kind] = (this.errors[kind] ?? 0) + 1;
    if (start !== undefined) this.spans.push({ kind, start, end: Date.now() });
    const ex = (this.examples[kind] ??= []);
    if (ex.length < 3) ex.push(detail.replace(/\s+/g, ' ').slice(0, 400));
  }
  /**
   * Moves the errors of calls that overlapped one of `outages` out of `errors` into
   * `duringOutage`: a box whose storage hung cannot answer until the watchdog brings it back,
   * and the soak is there to show that it does, not that nothing fails while it is down.
   */
  excuse(outages: [number, number][]) {
    for (const s of this.spans.splice(0)) {
      if (!outages.some(([a, b]) => s.start <= b && s.end >= a)) continue;
      this.duringOutage[s.kind] = (this.duringOutage[s.kind] ?? 0) + 1;
      if (--this.errors[s.kind] === 0) {
        delete this.errors[s.kind];
        delete this.examples[s.kind];
      }
    }
  }
  failures(): string[] {
    return Object.entries(this.errors).map(([k, n]) => `${k}: ${n}× — ${this.examples[k].join(' | ')}`);
  }
}

/** Why an answer is not the one wanted, in a few words (the kind of an error). */
function answerKind(r: CallResult): string {
  if (r.status === 0) return `no answer (${r.transport})`;
  const code = r.body?.error?.code;
  return `${r.status}${code ? ` ${code}` : ''}`;
}
const answerText = (what: string, r: CallResult) => `${what}: ${answerKind(r)}: ${r.text.slice(0, 300)}`;

export async function runSoak(opts: SoakOptions): Promise<SoakResult> {
  const progress = opts.progress ?? (() => undefined);
  const interrupted = opts.interrupted ?? (() => false);
  const startedAt = Date.now();
  const deadline = opts.durationLimitS > 0 ? startedAt + opts.durationLimitS * 1000 : Infinity;
  const config = soakConfig(opts.env);
  const rand = rng(opts.seed);
  const waitS = Math.min(300, opts.opBoundS);
  // A call with ?wait answers by then at the latest; exec has its own timeout below.
  const callTimeoutMs = (waitS + 30) * 1000;
  const EXEC_TIMEOUT_S = 120;

  // The host's log, kept for what the soak reports: warnings and above, and storage recovery.
  const logs: any[] = [];
  const log = hostLogger('info', (e) => {
    if (e.level >= 40 || WATCHDOG_RE.test(String(e.msg ?? '')) || /watchdog/i.test(String(e.part ?? ''))) logs.push(e);
  });

  const { progress: _p, interrupted: _i, env: _e, ...plainOptions } = opts;
  const result: SoakResult = {
    started_at: new Date(startedAt).toISOString(),
    duration_s: 0,
    options: plainOptions,
    machine: { cpus: os.cpus().length, ram_mb: Math.round(os.totalmem() / 2 ** 20), kernel: os.release(), loadavg_start: os.loadavg().map(round1) },
    host: { data_dir: config.dataDir, host_tag: config.hostTag, start_s: 0 },
    rounds: [],
    final: { keepers_deleted: 0, leftovers: {}, leftovers_unchecked: [], healthz: { status: 0, waited_s: 0 }, watchdog: [], watchdog_metrics: [], failures: [] },
    interrupted: false,
    error: null,
    failures: [],
    cleanup_problems: [],
  };

  let host: Host | undefined;
  let api: SoakApi | undefined;
  const projects = Array.from({ length: Math.max(1, opts.projects) }, (_, i) => `soak-${i}`);
  const boxPath = (b: SoakBox) => `/v1/projects/${b.project}/boxes/${b.name}`;
  const keepers: SoakBox[] = [];
  /** Operation ids the soak expects to fail (none today; a provoked failed job would go here). */
  const expectedFailedOps = new Set<string>();

  try {
    progress(`starting a host in ${config.dataDir} (host tag ${config.hostTag})`);
    const t0 = nowMs();
    host = await startHost(config, { roles: ['api', 'node'], log });
    result.host.start_s = round1((nowMs() - t0) / 1000);
    api = new SoakApi(host.url!, host.adminToken, callTimeoutMs);
    const a = api;
    const storage = host.node!.ctx.storage as ZfsStorage;
    const scope = { config, zfsRoot: storage.root };

    // ------------------------------------------------------------ the calls, each checked

    /** Waits for an operation the api answered 202 for; null when it ended, else why not. */
    const waitOp = async (opId: string | null): Promise<{ status: string; error: string | null } | string> => {
      if (!opId) return 'no Operation-Id header';
      const until = Date.now() + opts.opBoundS * 1000;
      for (;;) {
        const left = Math.ceil((until - Date.now()) / 1000);
        if (left <= 0) return `operation ${opId} unfinished after ${opts.opBoundS} s`;
        const r = await a.call('GET', `/v1/operations/${opId}/wait?timeout=${Math.min(60, left)}`);
        if (r.status === 200) return { status: r.body.status, error: r.body.error };
        if (r.status !== 408) return answerText(`wait for ${opId}`, r);
      }
    };

    /** A create or fork, until running. Answers true when the box runs. */
    const create = async (tally: Tally, b: SoakBox, fork?: SoakBox): Promise<boolean> => {
      const kind = fork ? 'fork' : 'create';
      const t0 = nowMs();
      const started = Date.now();
      const body = { name: b.name, config: fork ? undefined : BOX_CONFIG, environment: { SOAK_NAME: b.name }, ...(fork ? { fork: fork.name } : {}) };
      const r = await a.call('POST', `/v1/projects/${b.project}/boxes?wait=${waitS}`, body);
      let box = r.body;
      if (r.status === 202) {
        const done = await waitOp(r.headers.get('operation-id'));
        if (typeof done === 'string') return (tally.error(`${kind}: stuck`, `${b.name}: ${done}`), (b.broken = true), false);
        box = (await a.call('GET', boxPath(b))).body;
      } else if (r.status !== 200) {
        tally.error(`${kind}: ${answerKind(r)}`, answerText(b.name, r), started);
        return false;
      }
      if (box?.id) b.id = box.id;
      if (box?.status !== 'running') {
        b.broken = true;
        b.expected = box?.status === 'failed' ? 'running' : b.expected;
        tally.error(`${kind}: ended ${box?.status ?? '?'}`, `${b.name}: ${box?.error ?? JSON.stringify(box).slice(0, 300)}`, started);
        return false;
      }
      tally.sample(kind, nowMs() - t0);
      b.expected = 'running';
      return true;
    };

    /** An exec expected to answer 200 with this exit code (and output, when given). */
    const exec = async (
      tally: Tally,
      b: SoakBox,
      command: string[],
      want: { exit: number | 'nonzero'; stdout?: string; stderr?: string; stdoutBytes?: number; provoked?: string; timeoutS?: number; sample?: string },
    ): Promise<boolean> => {
      const t0 = Date.now();
      const r = await a.call('POST', `${boxPath(b)}/exec`, { command, timeout_secs: want.timeoutS ?? EXEC_TIMEOUT_S }, (EXEC_TIMEOUT_S + 30) * 1000);
      const what = `exec ${JSON.stringify(command).slice(0, 60)} in ${b.name}`;
      if (r.status !== 200) return (tally.error(`exec: ${answerKind(r)}`, answerText(what, r), t0), false);
      const res = r.body;
      const exitOk = want.exit === 'nonzero' ? res.exit_code !== 0 : res.exit_code === want.exit;
      const outOk =
        (want.stdout === undefined || res.stdout === want.stdout) &&
        (want.stderr === undefined || res.stderr === want.stderr) &&
        (want.stdoutBytes === undefined || (res.stdout?.length === want.stdoutBytes && !res.truncated));
      if (!exitOk) return (tally.error(`exec: exit ${res.exit_code}`, `${what}: wanted ${want.exit}; stdout ${JSON.stringify(res.stdout).slice(0, 120)} stderr ${JSON.stringify(res.stderr).slice(0, 200)}`, t0), false);
      if (!outOk) return (tally.error('exec: wrong output', `${what}: stdout ${JSON.stringify(res.stdout).slice(0, 120)} (${res.stdout?.length} bytes) stderr ${JSON.stringify(res.stderr).slice(0, 120)}`, t0), false);
      if (want.provoked) tally.provoke(want.provoked);
      tally.sample(want.sample ?? 'exec', r.ms);
      tally.count(want.sample ?? 'exec');
      return true;
    };

    /** stop, resume or delete, until done. */
    const change = async (tally: Tally, b: SoakBox, action: 'stop' | 'resume' | 'delete'): Promise<boolean> => {
      const t0 = nowMs();
      const started = Date.now();
      const r = action === 'delete' ? await a.call('DELETE', `${boxPath(b)}?wait=${waitS}`) : await a.call('POST', `${boxPath(b)}/${action}?wait=${waitS}`);
      // A box whose create was never answered may not exist: nothing to delete.
      const gone = action === 'delete' && (r.status === 204 || (r.status === 404 && !b.id));
      let status: string | null = gone ? 'gone' : r.status === 200 ? r.body?.status : null;
      let error: string | null = r.body?.error ?? null;
      if (r.status === 202) {
        const done = await waitOp(r.headers.get('operation-id'));
        if (typeof done === 'string') return (tally.error(`${action}: stuck`, `${b.name}: ${done}`), (b.broken = true), false);
        const g = await a.call('GET', boxPath(b));
        status = g.status === 404 ? 'gone' : g.body?.status;
        error = g.body?.error ?? done.error;
      } else if (status === null) {
        tally.error(`${action}: ${answerKind(r)}`, answerText(b.name, r), started);
        return false;
      }
      const want = action === 'stop' ? 'stopped' : action === 'resume' ? 'running' : 'gone';
      if (status !== want) {
        b.broken = true;
        tally.error(`${action}: ended ${status}`, `${b.name}: ${error ?? ''}`, started);
        return false;
      }
      b.expected = want;
      tally.sample(action, nowMs() - t0);
      return true;
    };

    // ------------------------------------------------------------ checks

    /** Listing of every project: each box of `boxes` with its expected status, nothing else. */
    const checkListing = async (tally: Tally, boxes: SoakBox[]) => {
      const want = new Map(boxes.filter((b) => b.expected !== 'gone' && !b.broken).map((b) => [`${b.project}/${b.name}`, b]));
      const skip = new Set(boxes.filter((b) => b.broken).map((b) => `${b.project}/${b.name}`));
      const seen = new Map<string, string>();
      for (const p of projects) {
        const r = await a.call('GET', `/v1/projects/${p}/boxes?max_results=1000`);
        if (r.status !== 200) return tally.error(`list: ${answerKind(r)}`, answerText(`list ${p}`, r));
        for (const b of r.body.boxes) seen.set(`${p}/${b.name}`, b.status);
        if (r.body.has_more) tally.error('list: more than 1000 boxes', p);
      }
      for (const [key, b] of want) {
        const s = seen.get(key);
        if (s !== b.expected) tally.error(`state: ${s ?? 'missing'} where ${b.expected} expected`, key);
      }
      for (const [key, s] of seen) {
        if (!want.has(key) && !skip.has(key)) tally.error(`state: ${s} where gone expected`, key);
      }
    };

    /** Operations since `fromSeq`: unfinished ones are waited for up to the bound, then stuck;
     *  failed ones fail the round unless asked for. */
    const checkOperations = async (tally: Tally, fromSeq: number) => {
      const rows = async () => host!.db('operations').where('seq', '>', fromSeq).select('seq', 'id', 'kind', 'status', 'error', 'created_at', 'updated_at');
      let all = await rows();
      for (;;) {
        const open = all.filter((o: any) => o.status === 'queued' || o.status === 'running');
        if (open.length === 0) break;
        const oldest = Math.min(...open.map((o: any) => Date.parse(o.created_at)));
        if (Date.now() - oldest > opts.opBoundS * 1000) {
          for (const o of open) tally.error(`operation stuck ${o.status}`, `${o.kind} ${o.id} since ${o.created_at}`);
          break;
        }
        await sleep(1000);
        all = await rows();
      }
      const byKind: RoundResult['operations'] = {};
      for (const o of all as any[]) {
        const k = (byKind[o.kind] ??= { n: 0, failed: 0, max_ms: 0 });
        k.n++;
        if (o.status === 'failed') {
          k.failed++;
          if (expectedFailedOps.has(o.id)) tally.provoke(`operation failed: ${o.kind}`);
          else tally.error(`operation failed: ${o.kind}`, `${o.id}: ${o.error}`);
        }
        if (o.status === 'succeeded' || o.status === 'failed') k.max_ms = Math.max(k.max_ms, Date.parse(o.updated_at) - Date.parse(o.created_at));
      }
      const maxSeq = Math.max(fromSeq, ...all.map((o: any) => o.seq as number));
      return { byKind, maxSeq };
    };

    const checkHealthz = async (tally: Tally) => {
      const t = Date.now();
      let r = await a.call('GET', '/healthz');
      // The watchdog gets 60 s to bring storage back (issue 13); give it 90.
      while (r.status !== 200 && Date.now() - t < 90_000) {
        await sleep(2000);
        r = await a.call('GET', '/healthz');
      }
      if (r.status !== 200) tally.error(`healthz: ${r.status}`, r.text.slice(0, 300));
      return { status: r.status, waited_s: round1((Date.now() - t) / 1000) };
    };

    const checkLeftovers = async (tally: Tally, keep: Set<string>): Promise<Leftovers> => {
      // Deletes answered; what they remove must be gone. A few seconds of grace for lazy unmounts.
      let l = await findLeftovers(scope, keep);
      for (let i = 0; i < 5 && leftoverCount(l) > 0; i++) {
        await sleep(1000);
        l = await findLeftovers(scope, keep);
      }
      for (const [kind, items] of Object.entries(l.found)) if (items.length) tally.error(`leftover ${kind}`, `${items.length}: ${items.slice(0, 5).join(', ')}`);
      for (const u of l.unchecked) tally.error('leftover check could not run', u);
      return l;
    };

    const watchdogLines = (from: number) =>
      logs
        .slice(from)
        .filter((e) => WATCHDOG_RE.test(String(e.msg ?? '')) || /watchdog/i.test(String(e.part ?? '')))
        .map((e) => `${new Date(e.time).toISOString().slice(11, 23)} ${e.msg}${e.err ? `: ${String(e.err?.message ?? e.err).slice(0, 200)}` : ''}${e.reason ? ` (${e.reason})` : ''}`);

    /**
     * The storage outages the watchdog reported and mended since log entry `from`, as epoch-ms
     * windows: from when its looks began to go unanswered (the restart's "no answer for N s",
     * and one look's timeout more) to a little after it said the storage recovered (the boxes
     * are started again by then). An outage it did not mend excuses nothing.
     */
    const outagesSince = (from: number): [number, number][] => {
      const out: [number, number][] = [];
      const entries = logs.slice(from);
      entries.forEach((e, i) => {
        const msg = String(e.msg ?? '');
        if (!/: restarting it$/.test(msg)) return;
        const silent = Number(/no answer for (\d+) s/.exec(msg)?.[1] ?? 0);
        const recovered = entries.slice(i + 1).find((x) => x.msg === 'storage recovered');
        if (recovered) out.push([Number(e.time) - silent * 1000 - OUTAGE_MARGIN_MS, Number(recovered.time) + OUTAGE_MARGIN_MS]);
      });
      return out;
    };

    const retriesSince = (from: number) => {
      const out: Record<string, number> = {};
      for (const e of logs.slice(from)) {
        if (e.msg !== 'operation step failed') continue;
        const m = `${e.final ? 'final: ' : ''}${String(e.err?.message ?? e.err ?? '?').split('\n')[0].slice(0, 160)}`;
        out[m] = (out[m] ?? 0) + 1;
      }
      return out;
    };

    // ------------------------------------------------------------ keepers

    if (opts.keepers > 0) {
      const tally = new Tally();
      progress(`making ${opts.keepers} long-lived boxes`);
      for (let k = 0; k < opts.keepers; k++) {
        const b: SoakBox = { name: `keep-${k}`, project: projects[k % projects.length], expected: 'gone' };
        if (await create(tally, b)) {
          b.file = `keeper-${k}-${crypto.randomBytes(4).toString('hex')}`;
          if (await exec(tally, b, ['sh', '-c', `echo ${b.file} > /root/soak && sync`], { exit: 0 })) keepers.push(b);
        }
      }
      if (Object.keys(tally.errors).length) throw new Error(`could not make the keeper boxes: ${tally.failures().join('; ')}`);
    }
    const keepIds = () => new Set(keepers.filter((k) => k.id).map((k) => k.id!));

    // ------------------------------------------------------------ rounds

    let opSeq = 0;
    // What the host's start and the keepers logged is not a round's.
    result.host.storage_log = watchdogLines(0);
    let logMark = logs.length;
    for (let round = 1; round <= opts.rounds; round++) {
      if (interrupted()) break;
      if (Date.now() >= deadline) {
        progress(`duration limit reached: no round ${round}`);
        break;
      }
      const roundStart = Date.now();
      const tally = new Tally();
      const throttled0 = a.throttled;
      const unavailable0 = a.unavailable;
      const boxes: SoakBox[] = [];
      const forks: SoakBox[] = [];
      progress(`round ${round}: ${opts.boxesPerRound} boxes, creates ${opts.createConcurrency} at a time, scripts ${opts.workConcurrency}, deletes ${opts.deleteConcurrency}`);

      // Creates feed the scripts: box i's script starts as soon as box i runs.
      let scriptsRunning = 0;
      const scriptWaiters: (() => void)[] = [];
      const scripts: Promise<void>[] = [];
      const takeSlot = async () => {
        while (scriptsRunning >= opts.workConcurrency) await new Promise<void>((r) => scriptWaiters.push(r));
        scriptsRunning++;
      };
      const freeSlot = () => {
        scriptsRunning--;
        scriptWaiters.shift()?.();
      };

      const script = async (b: SoakBox, i: number) => {
        const name = b.name;
        await exec(tally, b, ['sh', '-c', 'echo "$(hostname) $SOAK_NAME"'], { exit: 0, stdout: `${name} ${name}\n` });
        if (interrupted()) return;
        const writer = i % 5 === 0;
        if (writer) {
          b.file = `data-${name}-${crypto.randomBytes(3).toString('hex')}`;
          if (!(await exec(tally, b, ['sh', '-c', `echo ${b.file} > /root/soak && sync`], { exit: 0, sample: 'exec' }))) b.file = undefined;
        }
        if (i % 4 === 1) await exec(tally, b, ['sh', '-c', 'echo boom >&2; exit 7'], { exit: 7, stderr: 'boom\n', provoked: 'exec exit 7' });
        if (i % 10 === 3) await exec(tally, b, ['/no/such/command'], { exit: 'nonzero', provoked: 'exec of a missing command', sample: 'exec-missing' });
        if (i % 25 === 7) await exec(tally, b, ['sleep', '30'], { exit: 124, timeoutS: 1, provoked: 'exec killed by its timeout', sample: 'exec-timeout' });
        if (i % 20 === 9) await exec(tally, b, ['sh', '-c', 'head -c 65536 /dev/zero | tr "\\0" x'], { exit: 0, stdoutBytes: 65536 });
        if (i === 1) {
          // A taken name: refused up front, no operation.
          const r = await a.call('POST', `/v1/projects/${b.project}/boxes`, { name, config: BOX_CONFIG });
          if (r.status === 409) tally.provoke('create of a taken name (409)');
          else tally.error(`create of a taken name: ${answerKind(r)}`, answerText(name, r));
        }
        if (interrupted()) return;
        // A fork: of a running source, or (every other one) of a stopped source, resumed after.
        if (opts.forkEvery > 0 && i % opts.forkEvery === 0) {
          const fromStopped = (i / opts.forkEvery) % 2 === 1;
          if (fromStopped && !(await change(tally, b, 'stop'))) return;
          const f: SoakBox = { name: `${name}-f`, project: b.project, expected: 'gone' };
          forks.push(f);
          if (await create(tally, f, b)) {
            await exec(tally, f, ['sh', '-c', 'hostname; cat /root/soak 2>&1'], { exit: b.file ? 0 : 'nonzero', stdout: b.file ? `${f.name}\n${b.file}\n` : undefined });
          }
          if (fromStopped) {
            tally.count('fork of a stopped box');
            if (!(await change(tally, b, 'resume'))) return;
            if (b.file) await exec(tally, b, ['cat', '/root/soak'], { exit: 0, stdout: `${b.file}\n` });
          }
        }
        // A stop, a refused exec, and for every other one a resume.
        if (opts.stopEvery > 0 && i % opts.stopEvery === 2 % opts.stopEvery && i % (opts.forkEvery || Infinity) !== 0) {
          if (!(await change(tally, b, 'stop'))) return;
          const r = await a.call('POST', `${boxPath(b)}/exec`, { command: ['true'] });
          if (r.status === 409) tally.provoke('exec in a stopped box (409)');
          else tally.error(`exec in a stopped box: ${answerKind(r)}`, answerText(name, r));
          if (Math.floor(i / opts.stopEvery) % 2 === 0) {
            if (!(await change(tally, b, 'resume'))) return;
            await exec(tally, b, ['hostname'], { exit: 0, stdout: `${name}\n` });
          }
        }
      };

      const indexes = Array.from({ length: opts.boxesPerRound }, (_, i) => i);
      let skipped = 0;
      await mapLimit(indexes, opts.createConcurrency, async (i) => {
        if (interrupted() || Date.now() >= deadline) return void skipped++;
        const b: SoakBox = { name: `r${round}-b${i}`, project: projects[i % projects.length], expected: 'gone' };
        boxes.push(b);
        if (!(await create(tally, b))) return;
        await takeSlot();
        scripts.push(
          script(b, i)
            .catch((e) => tally.error('script crashed', `${b.name}: ${(e as Error).stack ?? e}`))
            .finally(freeSlot),
        );
      });
      await Promise.all(scripts);
      if (skipped) progress(`round ${round}: ${skipped} boxes not created (${interrupted() ? 'interrupted' : 'duration limit'})`);
      const all = [...boxes, ...forks];
      tally.count('boxes', boxes.length);
      tally.count('forks', forks.length);
      progress(`round ${round}: ${all.length} boxes made, checking their states`);
      await checkListing(tally, [...all, ...keepers]);

      // Deletes, while the keepers are exec'd into.
      progress(`round ${round}: deleting ${all.length} boxes, ${opts.deleteConcurrency} at a time, with execs in ${keepers.length} keepers`);
      let deleting = true;
      const keeperLoops = keepers.map(async (k) => {
        while (deleting) {
          await exec(tally, k, ['cat', '/root/soak'], { exit: 0, stdout: `${k.file}\n`, sample: 'keeper exec' });
          await sleep(100);
        }
      });
      await mapLimit(shuffle(all, rand), opts.deleteConcurrency, async (b) => {
        if (await change(tally, b, 'delete')) tally.count('deletes');
      });
      deleting = false;
      await Promise.all(keeperLoops);

      // Checks.
      progress(`round ${round}: checking operations, states, leftovers, health`);
      const ops = await checkOperations(tally, opSeq);
      opSeq = ops.maxSeq;
      await checkListing(tally, [...all, ...keepers]);
      for (const k of keepers) await exec(tally, k, ['cat', '/root/soak'], { exit: 0, stdout: `${k.file}\n`, sample: 'keeper exec' });
      const leftovers = await checkLeftovers(tally, keepIds());
      const healthz = await checkHealthz(tally);
      const watchdog = watchdogLines(logMark);
      const retries = retriesSince(logMark);
      tally.excuse(outagesSince(logMark));
      logMark = logs.length;
      tally.count('throttled (429, waited out)', a.throttled - throttled0);
      tally.count('unavailable (503 with Retry-After, waited out)', a.unavailable - unavailable0);

      const rr: RoundResult = {
        round,
        started_at: new Date(roundStart).toISOString(),
        duration_s: round1((Date.now() - roundStart) / 1000),
        counts: tally.counts,
        latency_ms: Object.fromEntries(Object.entries(tally.samples).map(([k, v]) => [k, latencyJson(summarize(v))])),
        errors: tally.errors,
        during_outage: tally.duringOutage,
        provoked: tally.provoked,
        job_retries: retries,
        operations: ops.byKind,
        watchdog,
        leftovers: Object.fromEntries(Object.entries(leftovers.found).filter(([, v]) => v.length)),
        healthz,
        failures: tally.failures().map((f) => `round ${round}: ${f}`),
      };
      result.rounds.push(rr);
      result.failures.push(...rr.failures);
      const s = (k: string) => rr.latency_ms[k] ? `${rr.latency_ms[k].p50}/${rr.latency_ms[k].p95}` : '-';
      progress(
        `round ${round} done in ${rr.duration_s} s: create p50/p95 ${s('create')} ms, exec ${s('exec')}, delete ${s('delete')}; ` +
          `${Object.values(rr.errors).reduce((x, y) => x + y, 0)} errors, ${watchdog.length} watchdog lines`,
      );
      for (const f of rr.failures) progress(`  FAIL ${f}`);
    }

    // ------------------------------------------------------------ the end: nothing left
    const tally = new Tally();
    const seq0 = opSeq;
    progress(`deleting the ${keepers.length} keepers; final checks`);
    for (const k of keepers) await exec(tally, k, ['cat', '/root/soak'], { exit: 0, stdout: `${k.file}\n`, sample: 'keeper exec' });
    for (const k of keepers) if (await change(tally, k, 'delete')) result.final.keepers_deleted++;
    await checkOperations(tally, seq0);
    await checkListing(tally, keepers);
    const leftovers = await checkLeftovers(tally, new Set());
    result.final.leftovers = Object.fromEntries(Object.entries(leftovers.found).filter(([, v]) => v.length));
    result.final.leftovers_unchecked = leftovers.unchecked;
    result.final.healthz = await checkHealthz(tally);
    result.final.watchdog = watchdogLines(logMark);
    tally.excuse(outagesSince(logMark));
    const metrics = await a.call('GET', '/metrics');
    result.final.watchdog_metrics = metrics.text.split('\n').filter((l) => !l.startsWith('#') && /watchdog|storage_(restart|recover)/i.test(l));
    result.final.failures = tally.failures().map((f) => `end: ${f}`);
    result.failures.push(...result.final.failures);
  } catch (e) {
    result.error = (e as Error).stack ?? String(e);
    result.failures.push(`the soak did not finish: ${(e as Error).message}`);
  } finally {
    result.interrupted = interrupted();
    progress('teardown');
    const problems: string[] = [];
    if (api && (result.error || result.interrupted)) {
      // Best effort through the API first, so the host removes what it made.
      const a = api;
      for (const p of projects) {
        const list = await a.call('GET', `/v1/projects/${p}/boxes?max_results=1000`).catch(() => null);
        const names: string[] = (list?.body?.boxes ?? []).map((b: any) => b.name);
        await mapLimit(names, 10, async (n) => {
          const r = await a.call('DELETE', `/v1/projects/${p}/boxes/${n}?wait=60`);
          if (![204, 404].includes(r.status)) problems.push(`delete ${p}/${n}: ${answerKind(r)}`);
        });
      }
    }
    if (host) await host.close().catch((e) => problems.push(`host close: ${(e as Error).message}`));
    await cleanupHost(config).catch((e) => problems.push(`cleanupHost: ${(e as Error).message}`));
    result.cleanup_problems = problems;
    result.duration_s = round1((Date.now() - startedAt) / 1000);
    result.machine.loadavg_end = os.loadavg().map(round1);
  }
  return result;
}

export { describeLeftovers };
