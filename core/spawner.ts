/**
 * Host commands started by a small helper process instead of the node itself.
 *
 * libuv starts a child with fork(), which copies the parent's page tables while the event loop
 * waits: measured here, a `spawn` holds the event loop ≈1 ms in a 50 MB process, 8 ms at 250 MB
 * and 29 ms at 650 MB. A node's process grows with its boxes, and a create runs about ten host
 * commands, so each create cost the whole node tens of milliseconds of its event loop, more with
 * every box (docs/decisions.md "What a node does per box, at scale"). The helper
 * (core/spawnerChild.ts) stays small, so its forks stay cheap; the node only sends it a message.
 *
 * Off unless `useSpawner()` was called (a host's node and worker roles turn it on: BOXHOST_SPAWNER):
 * a CLI or a test that runs a few commands would only pay the helper's start. A command the helper
 * never got (it could not be started, or was not ready) is started here instead; one it may have
 * run is never started twice.
 */
import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';

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
}

export interface SpawnError {
  message: string;
  code?: string;
  errno?: number;
  syscall?: string;
  path?: string;
  spawnargs?: string[];
}

export type SpawnAnswer =
  | { ready: true; id?: undefined }
  | { id: number; exitCode: number | null; stdout: Uint8Array; stderr: Uint8Array; error?: undefined; ready?: undefined }
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
}

/** A helper that fails to start this many times in a row is given up: commands start here. */
const MAX_FAILED_STARTS = 3;
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
    helper.child.disconnect();
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

function reachable(): Helper | null {
  if (helper?.child.connected) return helper;
  let child: ChildProcess;
  try {
    child = fork(path.join(__dirname, 'spawnerChild.js'), [], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
      // Its own flags only (not a profiler or inspector the node was started with).
      execArgv: ['--max-old-space-size=64'],
    });
  } catch {
    failedStarts++;
    return null;
  }
  const h: Helper = { child, ready: false };
  child.on('message', (a: SpawnAnswer) => {
    if (a.ready) {
      h.ready = true;
      failedStarts = 0;
      for (const p of pending.values()) if (p.helper === h) send(p);
      return;
    }
    const p = finish(a.id);
    if (!p) return;
    if (a.error) p.reject(Object.assign(new Error(a.error.message), a.error));
    else p.resolve({ exitCode: a.exitCode, stdout: Buffer.from(a.stdout).toString(), stderr: Buffer.from(a.stderr).toString() });
  });
  child.on('error', () => undefined);
  // 'close', not 'exit': answers still in the channel are read first.
  child.on('close', () => {
    if (helper === h) helper = null;
    if (!h.ready) failedStarts++;
    for (const [id, p] of pending) {
      if (p.helper !== h) continue;
      finish(id);
      // Never sent (the helper was not ready): started here. Sent: it may have run, so it is not
      // started twice; its outcome is unknown.
      p.reject(h.ready ? new Error(`the process that started ${p.req.argv[0]} exited before it answered`) : new SpawnerUnavailable('the spawner did not start'));
    }
    settle();
  });
  helper = h;
  settle();
  return h;
}

function send(p: Pending): void {
  try {
    p.helper.child.send(p.req, (e) => {
      if (e && finish(p.req.id)) p.reject(new SpawnerUnavailable(e.message));
    });
  } catch (e) {
    if (finish(p.req.id)) p.reject(new SpawnerUnavailable((e as Error).message));
  }
}

/** The helper keeps this process alive only while it runs a command for it. */
function settle(): void {
  if (!helper) return;
  const channel = helper.child.channel as unknown as { ref?(): void; unref?(): void } | undefined;
  if (pending.size > 0) {
    helper.child.ref();
    channel?.ref?.();
  } else {
    helper.child.unref();
    channel?.unref?.();
  }
}

/** Runs argv through the helper and collects its output; null when the helper cannot take it. */
export function spawnCollect(argv: string[], opts: { env?: NodeJS.ProcessEnv; input?: string | Buffer; timeoutMs?: number; cwd?: string; noStdio?: boolean }): Promise<Collected> | null {
  if (opts.noStdio && opts.input !== undefined) throw new Error('a command without stdio takes no input');
  const h = reachable();
  if (!h) return null;
  const req: SpawnRequest = { id: nextId++, argv, env: { ...(opts.env ?? process.env) }, input: opts.input, timeoutMs: opts.timeoutMs, cwd: opts.cwd, noStdio: opts.noStdio };
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
