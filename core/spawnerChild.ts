/**
 * The spawner (core/spawner.ts): a small process that starts the node's host commands for it,
 * so the node's own event loop never forks. Requests and answers go over the IPC channel; it
 * says `ready` once it listens, and exits when its parent goes (commands it started run on, as
 * they would have). Signals to the node's process group (Ctrl-C) are for the node: the helper
 * goes when the node lets it go.
 */
import { spawn, type ChildProcess, type StdioOptions } from 'node:child_process';
import type { SpawnAnswer, SpawnRequest } from './spawner';

function answer(a: SpawnAnswer): void {
  if (process.connected) process.send!(a);
}

const errorOf = (e: NodeJS.ErrnoException) => ({ message: e.message, code: e.code, errno: e.errno, syscall: e.syscall, path: e.path, spawnargs: (e as { spawnargs?: string[] }).spawnargs });

function start(req: SpawnRequest): void {
  let child: ChildProcess;
  try {
    const stdio: StdioOptions = req.noStdio ? 'ignore' : [req.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'];
    child = spawn(req.argv[0], req.argv.slice(1), { env: req.env, cwd: req.cwd, stdio });
  } catch (e) {
    answer({ id: req.id, error: errorOf(e as NodeJS.ErrnoException) });
    return;
  }
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout?.on('data', (b: Buffer) => out.push(b));
  child.stderr?.on('data', (b: Buffer) => err.push(b));
  const timer = req.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), req.timeoutMs) : undefined;
  let failed = false;
  child.on('error', (e: NodeJS.ErrnoException) => {
    if (timer) clearTimeout(timer);
    failed = true;
    answer({ id: req.id, error: errorOf(e) });
  });
  // With pipes, answered once they close (all the output read); without stdio, at exit: what
  // the command started may live on (`runc run --detach`).
  child.on(req.noStdio ? 'exit' : 'close', (code: number | null) => {
    if (timer) clearTimeout(timer);
    if (failed) return;
    // Bytes, decoded by the node: a large output never sits in this process's small heap as text.
    answer({ id: req.id, exitCode: code, stdout: Buffer.concat(out), stderr: Buffer.concat(err) });
  });
  if (req.input !== undefined) {
    child.stdin!.on('error', () => undefined);
    child.stdin!.end(typeof req.input === 'string' ? req.input : Buffer.from(req.input));
  }
}

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => undefined);
process.on('message', (m: SpawnRequest) => start(m));
process.on('disconnect', () => process.exit(0));
answer({ ready: true });
