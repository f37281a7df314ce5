/**
 * Host commands started by a small helper process instead of the node itself.
 *
 * libuv starts a child with fork(), which copies the parent's page tables while the event loop
 * waits: measured here, a `spawn` holds the event loop ≈1 ms in a 50 MB process, 8 ms at 250 MB
 * and 29 ms at 650 MB. A node's process grows with its boxes, and a create runs about ten host
 * commands, so each create cost the whole node tens of milliseconds of its event loop, more with
 * every box (docs/decisions.md "What a node does per box, at scale"). The helper is `boxd
 * spawner` (boxd/spawner.go): Go starts a command with clone(CLONE_VM|CLONE_VFORK), copying no
 * page tables at all, where a Node.js helper still forked its own 50 MB (on this paravirtualised
 * build machine a spawn of /bin/true cost 9.6 ms from a small Node.js process, 2.8 ms from Go).
 * The node only writes it a frame.
 *
 * Off unless `useSpawner()` was called (a host's node and worker roles turn it on: BOXHOST_SPAWNER):
 * a CLI or a test that runs a few commands would only pay the helper's start. A command the helper
 * never got (it could not be started, or was not ready) is started here instead; one it may have
 * run is never started twice.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

/** boxd as `npm run build` makes it (scripts/build-boxd.sh); its `spawner` command is the helper. */
export const SPAWNER_BIN = path.resolve(__dirname, '..', 'boxd', 'boxd');

export interface SpawnRequest {
  id: number;
  argv: string[];
  env: NodeJS.ProcessEnv;
  input?: string | Uint8Array;
  timeoutMs?: number;
  cwd?: string;
  /** No stdio at all (/dev/null), answered at exit rather than when its pipes close: a command
   *  that leaves processes behind holding its stdio (`runc run --detach`). */
  noStdio?: boolean;
  /** Work the helper does itself instead of starting argv (boxd/spawner.go `helperOp`). */
  op?: 'nft-elements' | 'box-net' | 'remount-private' | 'make-private';
  nft?: NftElements;
  net?: BoxNetRequest;
  /** The mount point of `remount-private` and `make-private`, and (`remount-private`) its
   *  mount's options to keep (mountinfo's names). */
  path?: string;
  keep?: string[];
  /** A file the helper holds locked (flock, exclusive) while the command runs (RunOptions.lockFile);
   *  the wait for it is bounded by `timeoutMs` too, apart from the run. */
  lock?: string;
}

/** A box's eth0 on its project bridge, made or removed by the helper over netlink as the CNI
 *  bridge + host-local plugins would (boxd/boxnet.go). */
export interface BoxNetRequest {
  delete?: boolean;
  netns: string;
  containerId: string;
  ifname: string;
  bridge: string;
  /** host-local's lease directory of the project's network. */
  leaseDir: string;
  subnet: string;
  gateway: string;
  rangeStart: string;
  rangeEnd: string;
}

export interface BoxNetResult {
  /** `a.b.c.d/prefix` */
  address: string;
  gateway: string;
  hostVeth: string;
  mac: string;
}

/** Set elements of an nftables table, added or deleted in one transaction over netlink by the
 *  helper (boxd/nftelem.go). Each key is laid out as nft does (fields padded to 4 bytes). */
export interface NftElements {
  /** NFPROTO_* (7: bridge). */
  family: number;
  table: string;
  /** Every set's keys go in the same transaction. */
  sets: { set: string; keys: Buffer[] }[];
  delete?: boolean;
}

export interface SpawnError {
  message: string;
  code?: string;
  errno?: number;
  syscall?: string;
  path?: string;
  spawnargs?: string[];
}

/** An answer's header, as the helper frames it (boxd/spawner.go); the output follows it. */
type AnswerHeader =
  | { ready: true; id?: undefined }
  | { id: number; exitCode: number | null; stdoutLen?: number; stderrLen?: number; error?: undefined; ready?: undefined }
  | { id: number; error: SpawnError; ready?: undefined };

export interface Collected {
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

/** The helper could not take the command (it never reached it): it can be started here instead. */
export class SpawnerUnavailable extends Error {}

interface Pending {
  helper: Helper;
  req: SpawnRequest;
  resolve(r: Collected): void;
  reject(e: Error): void;
  guard?: NodeJS.Timeout;
}

interface Helper {
  child: ChildProcess;
  ready: boolean;
  /** Still writable (its stdin open). */
  open: boolean;
}

/** A helper that fails to start this many times in a row is given up: commands start here. */
const MAX_FAILED_STARTS = 3;
/** The per-mount options a remount keeps (a bind remount sets the mount's flags to exactly those
 *  given; the rest of mountinfo's list is the filesystem's own, or is nosuid,nodev anyway). */
const REMOUNT_KEPT = new Set(['ro', 'noexec', 'noatime', 'nodiratime', 'relatime', 'nosymfollow']);
/** The largest input sent to the helper: its frames are bounded at 64 MiB, the JSON header too. */
const MAX_INPUT_BYTES = 60 << 20;
/** How long a new helper has to say it is ready (it does in a few ms; a loaded host is slower). */
const READY_WITHIN_MS = 10_000;
/** The node's own deadline for a command with a timeout, past the helper's: a stalled helper
 *  cannot hold a caller for good. */
const GUARD_MS = 5_000;

let enabled = false;
let helper: Helper | null = null;
let failedStarts = 0;
const pending = new Map<number, Pending>();
let nextId = 1;

/** Turns the helper on (or off: the running helper is let go once it has answered). */
export function useSpawner(on = true): void {
  enabled = on;
  if (on) failedStarts = 0;
  if (!on && helper && pending.size === 0) {
    letGo(helper);
    helper = null;
  }
}

/** Whether host commands go through the helper. */
export const spawnerEnabled = () => enabled && failedStarts < MAX_FAILED_STARTS;

function finish(id: number): Pending | undefined {
  const p = pending.get(id);
  if (!p) return undefined;
  pending.delete(id);
  if (p.guard) clearTimeout(p.guard);
  settle();
  return p;
}

function letGo(h: Helper): void {
  h.open = false;
  h.child.stdin?.end();
}

function reachable(): Helper | null {
  if (helper?.open) return helper;
  let child: ChildProcess;
  try {
    if (!fs.existsSync(SPAWNER_BIN)) throw new Error(`${SPAWNER_BIN} is not built`);
    // Its own process group: a signal to the node's group (Ctrl-C) is for the node.
    child = spawn(SPAWNER_BIN, ['spawner'], { stdio: ['pipe', 'pipe', 'inherit'], detached: true });
  } catch {
    failedStarts++;
    return null;
  }
  const h: Helper = { child, ready: false, open: true };
  // A helper that never says ready (a binary without this mode, a wedged start) is ended: what
  // waits on it is then started here ('close' below).
  let given = false;
  const readyBy = setTimeout(() => {
    if (h.ready) return;
    // Given up: a ready frame still in the pipe is not believed, and what waits is started here.
    given = true;
    child.kill('SIGKILL');
  }, READY_WITHIN_MS);
  readyBy.unref();
  child.stdin!.on('error', () => undefined); // a helper that ended: 'close' says why
  readFrames(child.stdout!, (header, out, err) => {
    const a = header as AnswerHeader;
    if (a.ready) {
      clearTimeout(readyBy);
      if (given) return;
      h.ready = true;
      failedStarts = 0;
      for (const p of pending.values()) if (p.helper === h) send(p);
      return;
    }
    const p = finish(a.id);
    if (!p) return;
    if (a.error) p.reject(Object.assign(new Error(a.error.message), a.error));
    else p.resolve({ exitCode: a.exitCode, stdout: out.toString(), stderr: err.toString() });
  });
  child.on('error', () => undefined);
  // 'close', not 'exit': answers still in the pipe are read first.
  child.on('close', () => {
    clearTimeout(readyBy);
    h.open = false;
    if (helper === h) helper = null;
    if (!h.ready) failedStarts++;
    for (const [id, p] of pending) {
      if (p.helper !== h) continue;
      finish(id);
      // Never sent (the helper was not ready): started here. Sent: it may have run, so it is not
      // started twice; its outcome is unknown.
      p.reject(h.ready ? new Error(`the process that started ${p.req.argv[0] ?? p.req.op} exited before it answered`) : new SpawnerUnavailable('the spawner did not start'));
    }
    settle();
  });
  helper = h;
  settle();
  return h;
}

const frameOf = (b: Buffer): Buffer => {
  const n = Buffer.alloc(4);
  n.writeUInt32BE(b.length);
  return Buffer.concat([n, b]);
};

function send(p: Pending): void {
  const { input, ...rest } = p.req;
  const bytes = input === undefined ? undefined : typeof input === 'string' ? Buffer.from(input) : Buffer.from(input);
  const env = Object.entries(rest.env)
    .filter((kv): kv is [string, string] => kv[1] !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  const nft = rest.nft && { ...rest.nft, sets: rest.nft.sets.map((x) => ({ set: x.set, keys: x.keys.map((k) => k.toString('base64')) })) };
  const header = Buffer.from(JSON.stringify({ ...rest, env, ...(nft ? { nft } : {}), ...(bytes ? { inputLen: bytes.length } : {}) }));
  try {
    p.helper.child.stdin!.write(bytes ? Buffer.concat([frameOf(header), frameOf(bytes)]) : frameOf(header), (e) => {
      if (e && finish(p.req.id)) p.reject(new SpawnerUnavailable(e.message));
    });
  } catch (e) {
    if (finish(p.req.id)) p.reject(new SpawnerUnavailable((e as Error).message));
  }
}

/**
 * Reads the helper's answers: a header frame, then (for an answer with output) a stdout frame
 * and a stderr frame. Output bytes stay bytes until the node decodes them.
 */
function readFrames(stream: NodeJS.ReadableStream, onAnswer: (header: unknown, out: Buffer, err: Buffer) => void): void {
  // Chunks are kept as they came until a whole frame is there (a 48 MB output is copied once).
  const chunks: Buffer[] = [];
  let buffered = 0;
  let header: { ready?: boolean; error?: unknown } | null = null;
  const frames: Buffer[] = [];
  const take = (n: number): Buffer => {
    const whole = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, buffered);
    chunks.length = 0;
    const rest = whole.subarray(n);
    if (rest.length) chunks.push(rest);
    buffered = rest.length;
    return whole.subarray(0, n);
  };
  let need = 4;
  let size = -1;
  stream.on('data', (chunk: Buffer) => {
    chunks.push(chunk);
    buffered += chunk.length;
    while (buffered >= need) {
      if (size < 0) {
        size = take(4).readUInt32BE(0);
        need = size;
        continue;
      }
      const body = take(size);
      size = -1;
      need = 4;
      if (!header) {
        header = JSON.parse(body.toString()) as { ready?: boolean; error?: unknown };
        // No output frames follow a ready or an error; an exit always has both.
        if (header.ready || header.error) {
          onAnswer(header, Buffer.alloc(0), Buffer.alloc(0));
          header = null;
        }
        continue;
      }
      frames.push(body);
      if (frames.length === 2) {
        const h = header;
        header = null;
        const [out, err] = frames.splice(0, 2);
        onAnswer(h, out, err);
      }
    }
  });
}

/** The helper keeps this process alive only while it runs a command for it. */
function settle(): void {
  if (!helper) return;
  const streams = [helper.child.stdin, helper.child.stdout] as unknown as ({ ref?(): void; unref?(): void } | null)[];
  if (pending.size > 0) {
    helper.child.ref();
    for (const s of streams) s?.ref?.();
  } else {
    helper.child.unref();
    for (const s of streams) s?.unref?.();
  }
}

/** Runs argv through the helper and collects its output; null when the helper cannot take it. */
export function spawnCollect(argv: string[], opts: { env?: NodeJS.ProcessEnv; input?: string | Buffer; timeoutMs?: number; cwd?: string; noStdio?: boolean; lockFile?: string }): Promise<Collected> | null {
  if (opts.noStdio && opts.input !== undefined) throw new Error('a command without stdio takes no input');
  // Past the helper's frame bound (boxd/spawner.go), an input would end the helper: started here.
  if (opts.input !== undefined && Buffer.byteLength(opts.input) > MAX_INPUT_BYTES) return null;
  const h = reachable();
  if (!h) return null;
  return request(h, { id: nextId++, argv, env: { ...(opts.env ?? process.env) }, input: opts.input, timeoutMs: opts.timeoutMs, cwd: opts.cwd, noStdio: opts.noStdio, lock: opts.lockFile });
}

/**
 * Adds (or deletes) nftables set elements through the helper, in one transaction; null when the
 * helper is off or cannot be started (the caller then runs `nft` itself); true once applied.
 * Rejects with the kernel's errno (`code`: ENOENT for a table, set or element that is not there).
 */
export async function nftElements(req: NftElements): Promise<true | null> {
  return (await helperOp({ op: 'nft-elements', nft: req })) === null ? null : true;
}

/** Makes (or removes) a box's eth0 through the helper; null when the helper is off or cannot be
 *  started (the caller then runs the CNI plugins). */
export async function boxNet(req: BoxNetRequest): Promise<BoxNetResult | null> {
  const out = await helperOp({ op: 'box-net', net: req });
  return out === null ? null : (JSON.parse(out || '{}') as BoxNetResult);
}

/** Makes a mount point nosuid,nodev through the helper (a bind remount, as `mount -o
 *  remount,bind,nosuid,nodev` does); null when the helper is off or cannot be started. */
export async function remountPrivate(path: string, options: Iterable<string>): Promise<true | null> {
  const keep = [...options].filter((o) => REMOUNT_KEPT.has(o));
  return (await helperOp({ op: 'remount-private', path, keep })) === null ? null : true;
}

/**
 * Makes the mount at `path` nosuid,nodev unless it is already, in one request: the helper reads
 * the mount table (its own /proc/self/mountinfo, the node's mount namespace) and remounts,
 * keeping the mount's other options. Answers what it found: `none` (no mount there), `private`
 * (it was already) or `remounted`; null when the helper is off, cannot be started, or predates
 * the op (the caller reads the table itself then).
 */
export async function makePrivate(path: string): Promise<'none' | 'private' | 'remounted' | null> {
  try {
    const out = await helperOp({ op: 'make-private', path });
    if (out === null) return null;
    if (out === 'none' || out === 'private' || out === 'remounted') return out;
    throw new Error(`the spawner answered make-private with ${JSON.stringify(out.slice(0, 40))}`);
  } catch (e) {
    // A helper binary older than the node's code (`npm run build` makes both): the caller's way.
    if (/unknown op/.test((e as Error).message)) return null;
    throw e;
  }
}

/** An op of the helper's own: its result (stdout), or null when the helper is not there. */
async function helperOp(what: Pick<SpawnRequest, 'op' | 'nft' | 'net' | 'path' | 'keep'>): Promise<string | null> {
  if (!spawnerEnabled()) return null;
  const h = reachable();
  if (!h) return null;
  try {
    return (await request(h, { id: nextId++, argv: [], env: {}, ...what, timeoutMs: 15_000 })).stdout;
  } catch (e) {
    if (e instanceof SpawnerUnavailable) return null;
    throw e;
  }
}

function request(h: Helper, req: SpawnRequest): Promise<Collected> {
  const argv = req.argv.length ? req.argv : [req.op ?? '?'];
  // A locked command may wait for its lock as long as it may run (boxd/spawner.go).
  const opts = { timeoutMs: req.timeoutMs && (req.lock ? 2 * req.timeoutMs : req.timeoutMs) };
  return new Promise<Collected>((resolve, reject) => {
    const p: Pending = { helper: h, req, resolve, reject };
    if (opts.timeoutMs) {
      p.guard = setTimeout(() => {
        if (finish(req.id)) reject(new Error(`${argv[0]} gave no answer through the spawner within ${opts.timeoutMs! + GUARD_MS} ms`));
      }, opts.timeoutMs + GUARD_MS);
    }
    pending.set(req.id, p);
    settle();
    if (h.ready) send(p);
  });
}
