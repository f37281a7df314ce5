import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { PoolLock } from '../workers/storage/poolLock';

/** PoolLock with the real `flock`: two locks on one file (as two processes hold them) take
 *  turns, and a holder that dies lets go. */
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-pool-lock-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = path.join(dir, 'zfs', 'pool.lock');

t.test('holders of one file take turns, in one lock and across two', async (t) => {
  const locks = [new PoolLock(file), new PoolLock(file)];
  let inside = 0;
  let most = 0;
  const order: number[] = [];
  await Promise.all(
    [0, 1, 2, 3, 4, 5].map((i) =>
      locks[i % 2].run(async () => {
        inside++;
        most = Math.max(most, inside);
        await new Promise((r) => setTimeout(r, 20));
        order.push(i);
        inside--;
      }),
    ),
  );
  t.equal(most, 1, 'never two holders at once');
  t.equal(order.length, 6, 'every call ran');
  t.same(order.filter((i) => i % 2 === 0), [0, 2, 4], 'calls of one lock in the order they came');
});

t.test('a failing call lets go, and answers its error', async (t) => {
  const lock = new PoolLock(file);
  await t.rejects(lock.run(async () => Promise.reject(new Error('boom'))), /boom/);
  t.equal(await lock.run(async () => 7), 7);
});

t.test('a process killed while holding it lets go', async (t) => {
  const script = `const { PoolLock } = require(${JSON.stringify(path.resolve(__dirname, '../workers/storage/poolLock'))});
new PoolLock(${JSON.stringify(file)}).run(() => { console.log('holding'); return new Promise(() => {}); });`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve) => child.stdout.on('data', (d: Buffer) => d.toString().includes('holding') && resolve()));
  const lock = new PoolLock(file);
  let got = false;
  const waiting = lock.run(async () => {
    got = true;
  });
  await new Promise((r) => setTimeout(r, 300));
  t.equal(got, false, 'held by the other process');
  child.kill('SIGKILL');
  await waiting;
  t.equal(got, true, 'taken once it died');
});
