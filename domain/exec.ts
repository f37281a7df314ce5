import crypto from 'node:crypto';
import type IORedis from 'ioredis';
import type { DomainContext, Identity } from './context';
import { BoxhostError, conflict } from '../core/errors';
import { canExec, DEFAULT_EXEC_TIMEOUT_SECS } from '../core/box';
import type { Config } from '../core/config';
import type { ExecResult } from '../core/apiTypes';
import { loadBox } from './boxRef';

export interface ExecRequest {
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  no_hup?: boolean;
  shell?: boolean;
  tty?: boolean;
  user?: string;
  timeout_secs?: number;
}

export { DEFAULT_EXEC_TIMEOUT_SECS, MAX_EXEC_TIMEOUT_SECS } from '../core/box';

/** How long a caller over an exec cap is told to wait: a slot frees whenever any exec ends. */
const EXEC_RETRY_AFTER_S = 1;

/** Releases what `ExecSlots.acquire` took (safe to call more than once). */
export type ReleaseSlots = () => Promise<void>;

/**
 * Concurrent execs per box and per token (`config.execLimits`), counted where every api
 * process sees them. Over a cap → 429 `rate_limited` with `Retry-After`.
 */
export interface ExecSlots {
  acquire(boxId: string, tokenId: string): Promise<ReleaseSlots>;
}

const overCap = (what: string, cap: number) =>
  new BoxhostError('rate_limited', `too many concurrent execs ${what} (at most ${cap}); try again when one has ended`, [], { 'Retry-After': String(EXEC_RETRY_AFTER_S) });

/**
 * Takes a slot in both sets atomically, or none. Each set is a sorted set of leases scored by
 * their expiry in Redis's own clock (so api processes with skewed clocks agree); expired leases
 * (an api that crashed mid-exec) are dropped before counting.
 * KEYS: box set, token set. ARGV: lease id, lease ms, box cap, token cap.
 * Answers 0 (taken), 1 (box full) or 2 (token full).
 */
const ACQUIRE_LUA = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, 2 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 2 end
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ttl * 2)
end
return 0`;

/** Extends a lease that is still held (XX: a lease already dropped is not brought back). */
const RENEW_LUA = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ttl * 2)
end
return 0`;

/**
 * `ExecSlots` on Redis. A slot is a lease of `leaseMs`, renewed every third of it while its
 * exec runs, and released (ZREM) on every way out; an api process that dies mid-exec leaves
 * leases that expire within `leaseMs` instead of a count that never comes down. While Redis does
 * not answer, the process counts in memory: the caps then hold per api process, and the node's
 * own cap still holds for the node.
 */
export class RedisExecSlots implements ExecSlots {
  private readonly local = new Map<string, number>();

  constructor(
    private readonly redis: IORedis,
    private readonly prefix: string,
    private readonly limits: Config['execLimits'],
    private readonly leaseMs = 30_000,
  ) {}

  async acquire(boxId: string, tokenId: string): Promise<ReleaseSlots> {
    const keys = [`${this.prefix}:exec:box:${boxId}`, `${this.prefix}:exec:token:${tokenId}`];
    const lease = crypto.randomUUID();
    let answer: number;
    try {
      answer = Number(await this.redis.eval(ACQUIRE_LUA, 2, ...keys, lease, this.leaseMs, this.limits.perBox, this.limits.perToken));
    } catch {
      return this.acquireLocally(keys);
    }
    if (answer === 1) throw overCap('in this box', this.limits.perBox);
    if (answer === 2) throw overCap('for this token', this.limits.perToken);
    const renew = setInterval(() => {
      this.redis.eval(RENEW_LUA, 2, ...keys, lease, this.leaseMs).catch(() => undefined);
    }, Math.max(1000, Math.floor(this.leaseMs / 3)));
    renew.unref();
    let released = false;
    return async () => {
      if (released) return;
      released = true;
      clearInterval(renew);
      // A release Redis misses is not a leak: the lease expires on its own.
      await Promise.all(keys.map((k) => this.redis.zrem(k, lease))).catch(() => undefined);
    };
  }

  /** The same caps, counted in this process only (Redis is not answering). */
  private acquireLocally(keys: string[]): ReleaseSlots {
    const [box, token] = keys;
    if ((this.local.get(box) ?? 0) >= this.limits.perBox) throw overCap('in this box', this.limits.perBox);
    if ((this.local.get(token) ?? 0) >= this.limits.perToken) throw overCap('for this token', this.limits.perToken);
    for (const k of keys) this.local.set(k, (this.local.get(k) ?? 0) + 1);
    let released = false;
    return async () => {
      if (released) return;
      released = true;
      for (const k of keys) {
        const n = (this.local.get(k) ?? 1) - 1;
        if (n <= 0) this.local.delete(k);
        else this.local.set(k, n);
      }
    };
  }
}

export interface ExecOptions {
  /** Caps per box and per token (absent: none here; the node's own cap still holds). */
  slots?: ExecSlots;
  /** Aborted when the caller went away: the command ends with it. */
  signal?: AbortSignal;
}

/** DESIGN.md §4 exec: synchronous, through the box's node (in-process or its agent). */
export async function execInBox(ctx: DomainContext, identity: Identity, project: string, name: string, req: ExecRequest, opts: ExecOptions = {}): Promise<ExecResult> {
  const box = await loadBox(ctx, identity, project, name);
  // The node first: a box on a node that is down is `unknown`, whatever its row says (503).
  const node = await ctx.nodes.client(box.node);
  if (!canExec(box.status)) throw conflict(`box ${project}/${name} is ${box.status}; exec needs it running`);
  const release = opts.slots ? await opts.slots.acquire(box.id, identity.tokenId) : undefined;
  try {
    const r = await node.exec(box.id, {
      command: req.shell ? ['/bin/sh', '-c', req.command.join(' ')] : req.command,
      cwd: req.cwd,
      // The box-level environment is the base; the request's env wins over it.
      env: { ...box.environment, ...(req.env ?? {}) },
      user: req.user,
      tty: req.tty,
      detach: req.no_hup,
      timeoutMs: (req.timeout_secs ?? DEFAULT_EXEC_TIMEOUT_SECS) * 1000,
      // A detached process outlives its request by definition (no_hup).
      signal: req.no_hup ? undefined : opts.signal,
    });
    return { detached: r.detached, exit_code: r.exitCode, process: r.pid, stdout: r.stdout, stderr: r.stderr, truncated: r.truncated };
  } finally {
    // Not waited for: the answer need not wait for Redis. The release's commands are queued on
    // this process's connection now, so a later exec of this process is counted after it.
    release?.().catch(() => undefined);
  }
}
