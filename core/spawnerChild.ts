/**
 * The spawner (core/spawner.ts): a small process that starts the node's host commands for it,
 * so the node's own event loop never forks. Requests and answers go over the IPC channel; it
 * exits when its parent goes (commands it started run on, as they would have).
 */
import { spawn } from 'node:child_process';
import type { SpawnAnswer, SpawnRequest } from './spawner';

function answer(a: SpawnAnswer): void {
  if (process.connected) process.send!(a);
}

function start(req: SpawnRequest): void {
  let child;
  try {
    child = spawn(req.argv[0], req.argv.slice(1), { env: req.env, stdio: [req.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
  } catch (e) {
    answer({ id: req.id, error: { message: (e as Error).message, code: (e as NodeJS.ErrnoException).code } });
    return;
  }
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout!.on('data', (b: Buffer) => out.push(b));
  child.stderr!.on('data', (b: Buffer) => err.push(b));
  const timer = req.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), req.timeoutMs) : undefined;
  let failed = false;
  child.on('error', (e: NodeJS.ErrnoException) => {
    if (timer) clearTimeout(timer);
    failed = true;
    answer({ id: req.id, error: { message: e.message, code: e.code } });
  });
  child.on('close', (code) => {
    if (timer) clearTimeout(timer);
    if (failed) return;
    answer({ id: req.id, exitCode: code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() });
  });
  if (req.input !== undefined) {
    child.stdin!.on('error', () => undefined);
    child.stdin!.end(typeof req.input === 'string' ? req.input : Buffer.from(req.input));
  }
}

process.on('message', (m: SpawnRequest) => start(m));
process.on('disconnect', () => process.exit(0));
