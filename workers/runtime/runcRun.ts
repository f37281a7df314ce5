import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { spawnCollect, spawnerEnabled, SpawnerUnavailable } from '../../core/spawner';

/** How much of runc's own log a failed start reports. */
const RUNC_LOG_TAIL_BYTES = 4096;

/**
 * `runc run --detach`. The container's PID 1 gets /dev/null for stdio: no host file grows with
 * what a box writes to /proc/1/fd/1, and pipes would hang the caller (the container inherits
 * them). runc's own diagnostics go to `<bundle>/runc.log` (JSON), made anew for each start.
 * Answers runc's exit code.
 */
export function runDetached(runcBin: string, root: string, bundle: string, id: string, listen?: { boxd: string; socket: string }): Promise<number | null> {
  // The caller removed the last start's log (a start appends to it).
  const log = path.join(bundle, 'runc.log');
  const runc = [runcBin, '--root', root, '--log', log, '--log-format', 'json', 'run', '--detach', ...(listen ? ['--preserve-fds', '1'] : []), '--bundle', bundle, id];
  // With boxd, `boxd listen` makes the box's listening socket on the host side and execs runc
  // with it as fd 3, which runc hands to the container's PID 1 (boxd) and nothing else.
  const argv = listen ? [listen.boxd, 'listen', listen.socket, ...runc] : runc;
  // Started by the node's spawner when it has one (core/spawner.ts: a fork of the node itself
  // holds its event loop for milliseconds); here when the spawner never got it.
  const viaSpawner = spawnerEnabled() ? spawnCollect(argv, { cwd: bundle, noStdio: true }) : null;
  if (viaSpawner) {
    return viaSpawner.then(
      (r) => r.exitCode,
      (e) => (e instanceof SpawnerUnavailable ? startHere(argv, bundle) : Promise.reject(e)),
    );
  }
  return startHere(argv, bundle);
}

function startHere(argv: string[], bundle: string): Promise<number | null> {
  return new Promise<number | null>((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), { cwd: bundle, stdio: 'ignore' });
    child.on('error', reject);
    child.on('exit', (c) => resolve(c));
  });
}

/** What runc said of a failed start: the messages of the last RUNC_LOG_TAIL_BYTES of its log
 *  (JSON lines; only its end is read, whatever the file's size). */
export async function runcLogTail(bundle: string): Promise<string> {
  let tail = '';
  try {
    const fh = await fs.promises.open(path.join(bundle, 'runc.log'), 'r');
    try {
      const { size } = await fh.stat();
      const len = Math.min(size, RUNC_LOG_TAIL_BYTES);
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, size - len);
      tail = buf.toString('utf8');
    } finally {
      await fh.close();
    }
  } catch {
    return '';
  }
  return tail
    .split('\n')
    .map((line) => {
      try {
        return String((JSON.parse(line) as { msg?: string }).msg ?? '');
      } catch {
        return line;
      }
    })
    .filter((m) => m.trim() !== '')
    .join('\n');
}
