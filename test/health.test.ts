import net from 'node:net';
import fs from 'node:fs';
import { spawn, ChildProcess } from 'node:child_process';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { sleep } from '../core/command';

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });

async function startRedis(port: number, dir: string): Promise<ChildProcess> {
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise<boolean>((r) => {
      const c = net.connect(port, '127.0.0.1', () => (c.end(), r(true)));
      c.on('error', () => r(false));
    });
    if (ok) return child;
    await sleep(50);
  }
  throw new Error('redis-server did not start');
}

const stop = (c: ChildProcess) => new Promise((r) => (c.exitCode !== null ? r(null) : (c.once('exit', r), c.kill('SIGKILL'))));

t.test('healthz turns 503 while Redis is down and back to 200 when it returns', async (t) => {
  const port = await freePort();
  const dir = fs.mkdtempSync('/var/tmp/bh-redis-');
  let redis = await startRedis(port, dir);
  t.teardown(async () => {
    await stop(redis);
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const host = await startTestHost(t, { REDIS_URL: `redis://127.0.0.1:${port}` });
  const health = () => host.call('GET', '/healthz', { token: null });

  t.equal((await health()).status, 200);
  await stop(redis);
  const down = await health();
  t.equal(down.status, 503);
  t.equal(down.body.status, 'degraded');
  t.equal(down.body.checks.redis, 'error', 'which check failed, not the raw error (no host, port or client message)');
  t.notMatch(down.text, new RegExp(`${port}|ECONNREFUSED|127\\.0\\.0\\.1|/var/`), 'nothing of the connection leaks');
  t.equal(down.body.checks.db, 'ok');

  // A job-backed request while Redis is down is refused with 503 and leaves no row behind.
  const before = await host.db('operations').count({ n: '*' });
  const enqueue = host.db.transaction((trx) => host.api!.queue.enqueue(trx, { kind: 'x', payload: {} }, { resource: '/v1/x', node: host.config.nodeId }));
  await t.rejects(enqueue);
  t.same(await host.db('operations').count({ n: '*' }), before, 'rolled back');

  redis = await startRedis(port, dir);
  let back = await health();
  for (let i = 0; i < 100 && back.status !== 200; i++) {
    await sleep(200);
    back = await health();
  }
  t.equal(back.status, 200, JSON.stringify(back.body));
  t.same(back.body.checks, { db: 'ok', redis: 'ok', storage: 'ok', workers: 1, nodes: { local: 'ok' } });
});
