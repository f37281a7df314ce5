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
 * Off unless `useSpawner()` was called (a host's node role turns it on): a CLI or a test that
 * runs a few commands would only pay the helper's start. When the helper cannot be reached, a
 * command is started here as before.
 */
import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';

export interface SpawnRequest {
  id: number;
  argv: string[];
  env: NodeJS.ProcessEnv;
  input?: string | Uint8Array;
  timeoutMs?: number;
}

export type SpawnAnswer =
  | { id: number; exitCode: number | null; stdout: string; stderr: string; error?: undefined }
  | { id: number; error: { message: string; code?: string } };

export interface Collected {
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

/** The helper could not take the command (it never reached it): it can be started here instead. */
export class SpawnerUnavailable extends Error {}

interface Pending {
  helper: ChildProcess;
  what: string;
  resolve(r: Collected): void;
  reject(e: Error): void;
}

let enabled = false;
let helper: ChildProcess | null = null;
const pending = new Map<number, Pending>();
let nextId = 1;

/** Turns the helper on (or off: the running helper is let go). */
export function useSpawner(on = true): void {
  enabled = on;
  if (!on && helper) {
    helper.disconnect();
    helper = null;
  }
}

/** Whether host commands go through the helper. */
export const spawnerEnabled = () => enabled;

function reachable(): ChildProcess | null {
  if (helper?.connected) return helper;
  let child: ChildProcess;
  try {
    child = fork(path.join(__dirname, 'spawnerChild.js'), [], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
      // Its own flags only (not a profiler or inspector the node was started with).
      execArgv: ['--max-old-space-size=64'],
    });
  } catch {
    return null;
  }
  child.on('message', (a: SpawnAnswer) => {
    const p = pending.get(a.id);
    if (!p) return;
    pending.delete(a.id);
    settle();
    if (a.error) p.reject(Object.assign(new Error(a.error.message), { code: a.error.code }));
    else p.resolve({ exitCode: a.exitCode, stdout: a.stdout, stderr: a.stderr });
  });
  child.on('error', () => undefined);
  child.on('exit', () => {
    if (helper === child) helper = null;
    for (const [id, p] of pending) {
      if (p.helper !== child) continue;
      pending.delete(id);
      // The command may have run: its outcome is unknown, so it is not started again here.
      p.reject(new Error(`the process that started ${p.what} exited before it answered`));
    }
    settle();
  });
  helper = child;
  settle();
  return child;
}

/** The helper keeps this process alive only while it runs a command for it. */
function settle(): void {
  if (!helper) return;
  const channel = helper.channel as unknown as { ref?(): void; unref?(): void } | undefined;
  if (pending.size > 0) {
    helper.ref();
    channel?.ref?.();
  } else {
    helper.unref();
    channel?.unref?.();
  }
}

/** Runs argv through the helper and collects its output; null when the helper cannot take it. */
export function spawnCollect(argv: string[], opts: { env?: NodeJS.ProcessEnv; input?: string | Buffer; timeoutMs?: number }): Promise<Collected> | null {
  const h = reachable();
  if (!h) return null;
  const id = nextId++;
  const req: SpawnRequest = { id, argv, env: { ...(opts.env ?? process.env) }, input: opts.input, timeoutMs: opts.timeoutMs };
  return new Promise<Collected>((resolve, reject) => {
    pending.set(id, { helper: h, what: argv[0], resolve, reject });
    settle();
    try {
      h.send(req, (e) => {
        if (!e || !pending.has(id)) return;
        pending.delete(id);
        settle();
        reject(new SpawnerUnavailable(e.message));
      });
    } catch (e) {
      pending.delete(id);
      settle();
      reject(new SpawnerUnavailable((e as Error).message));
    }
  });
}

