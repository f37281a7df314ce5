/**
 * The embedded redis-server (core/redis.ts) left behind by a killed process: the next process
 * on the data dir takes it over and stops it when it stops; one whose starter still runs is left
 * to it. Real redis-server processes on unix sockets in temp data dirs.
 */
import t, { type Test } from 'tap';
import fs from 'node:fs';
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import pino from 'pino';
import { sleep } from '../core/command';
import { EmbeddedRedis, embeddedRedisSocket } from '../core/redis';
import { testConfig } from './helpers/host';
import { processStamp } from '../core/procStamp';

const log = pino({ level: 'silent' });

const pidsServing = (socket: string) =>
  fs.readdirSync('/proc').filter((p) => {
    try {
      return /^\d+$/.test(p) && fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'redis-server' && fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(socket);
    } catch {
      return false;
    }
  });

async function until(f: () => boolean, ms = 5000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(50)) if (f()) return true;
  return f();
}

/** A redis-server on a temp data dir's embedded socket, its starter file naming `starter`. */
async function serving(t: Test, starter: string) {
  const config = testConfig();
  t.teardown(() => fs.rmSync(config.dataDir, { recursive: true, force: true }));
  const socket = embeddedRedisSocket(config);
  fs.mkdirSync(path.dirname(socket), { recursive: true });
  const server = spawn('redis-server', ['--port', '0', '--unixsocket', socket, '--save', '', '--daemonize', 'no'], { stdio: 'ignore' });
  t.teardown(() => server.kill('SIGKILL'));
  t.ok(await until(() => pidsServing(socket).length === 1 && fs.existsSync(socket)), 'it serves');
  fs.writeFileSync(path.join(path.dirname(socket), 'starter'), JSON.stringify({ redis: processStamp(server.pid), starter }));
  return { config, socket, server };
}

t.test('an orphan left by a killed process is taken over and stopped', async (t) => {
  // As a host that was killed leaves it: serving, and its starter file naming a process gone.
  const { config, socket, server } = await serving(t, processStamp(spawnSync('true').pid));
  const orphan = String(server.pid);
  const redis = new EmbeddedRedis(config, log);
  await redis.start();
  t.same(pidsServing(socket), [orphan], 'reused, not started again');
  await redis.stop();
  t.ok(await until(() => pidsServing(socket).length === 0 || server.exitCode !== null), 'stopped with the process that took it over');
});

t.test('one whose starter still runs is left to it', async (t) => {
  // This test process is its starter (as a host's api process is for its worker processes).
  const { config, socket, server: child } = await serving(t, processStamp());
  const redis = new EmbeddedRedis(config, log);
  await redis.start();
  await redis.stop();
  await sleep(300);
  t.same(pidsServing(socket), [String(child.pid)], 'still serving: not this process to stop');
});
