import t, { type Test } from 'tap';
import pino from 'pino';
import { sleep } from '../core/command';
import { MockStorage } from '../workers/storage/mock';
import { Gate } from '../workers/storage/zfs';
import { startStorageWatchdog } from '../workers/storageWatchdog';
import type { StorageProbe } from '../workers/drivers';
import { LocalNode } from '../workers/agent/localNode';
import { MockRuntime } from '../workers/runtime/mock';
import type { BoxhostError } from '../core/errors';

/** The watchdog's decisions on a mock storage whose looks answer what the test says. The real
 *  daemon killed and hung is test/storage-watchdog.test.ts. */
const log = pino({ level: 'silent' });

function watch(t: Test, storage: MockStorage, hangMs = 300) {
  const recoveries: string[] = [];
  const dog = startStorageWatchdog({
    storage,
    log,
    intervalMs: 20,
    hangMs,
    recover: async (why) => {
      recoveries.push(why);
      await storage.restart();
    },
  });
  t.teardown(() => dog.stop());
  return { dog, recoveries };
}

t.test('a healthy storage is left alone', async (t) => {
  const storage = new MockStorage();
  const { dog, recoveries } = watch(t, storage);
  await sleep(200);
  t.same(recoveries, []);
  t.equal(dog.last?.state, 'ok', 'it did look');
});

t.test('a dead storage is restarted at once, once', async (t) => {
  const storage = new MockStorage();
  const { dog, recoveries } = watch(t, storage);
  await sleep(60);
  storage.probeState = 'dead';
  for (let i = 0; i < 100 && recoveries.length === 0; i++) await sleep(20);
  t.equal(recoveries.length, 1, 'recovered');
  t.match(recoveries[0], /storage died/);
  await sleep(200);
  t.equal(recoveries.length, 1, 'and not again while it answers');
  t.equal(dog.recoveries, 1);
  t.equal(storage.restarts, 1);
});

t.test('a hung storage is restarted only once it has hung for hangMs', async (t) => {
  const storage = new MockStorage();
  const { recoveries } = watch(t, storage, 400);
  storage.probeState = 'hung';
  await sleep(200);
  t.same(recoveries, [], 'not before hangMs');
  for (let i = 0; i < 100 && recoveries.length === 0; i++) await sleep(20);
  t.equal(recoveries.length, 1, 'then restarted');
  t.match(recoveries[0], /storage hung/);
});

t.test('a hang that clears by itself is not restarted', async (t) => {
  const storage = new MockStorage();
  const { recoveries } = watch(t, storage, 400);
  storage.probeState = 'hung';
  await sleep(150);
  storage.probeState = 'ok';
  await sleep(500);
  t.same(recoveries, []);
});

t.test('a storage that answers but is not usable, or cannot be restarted, is only reported', async (t) => {
  const faulted = new MockStorage();
  faulted.probeState = 'error';
  const a = watch(t, faulted);
  const dead = new MockStorage();
  dead.probeState = 'dead';
  dead.restartable = false;
  const b = watch(t, dead);
  await sleep(300);
  t.same(a.recoveries, [], 'FAULTED: a restart would not mend it');
  t.same(b.recoveries, [], 'kernel ZFS: boxhost cannot restart it');
  t.equal(dead.restarts, 0);
});

t.test('a recovery that fails is tried again later', async (t) => {
  const storage = new MockStorage();
  let fails = 1;
  const tries: StorageProbe['state'][] = [];
  const dog = startStorageWatchdog({
    storage,
    log,
    intervalMs: 20,
    hangMs: 100,
    recover: async () => {
      tries.push(storage.probeState);
      if (fails-- > 0) throw new Error('could not start the daemon');
      await storage.restart();
    },
  });
  t.teardown(() => dog.stop());
  storage.probeState = 'dead';
  for (let i = 0; i < 400 && dog.recoveries === 0; i++) await sleep(25);
  t.equal(tries.length, 2, 'failed once, then succeeded (after its back-off)');
  t.equal(dog.recoveries, 1);
});

t.test('while the storage is being restarted, execs answer 503 with Retry-After, and the storage check says why', async (t) => {
  const node = new LocalNode('n1', new MockRuntime(), new MockStorage());
  node.storageRecovering = 'storage hung (no answer)';
  const err = await node.exec('b1', { command: ['true'] }).then(
    () => null,
    (e: BoxhostError) => e,
  );
  t.equal(err?.code, 'unavailable');
  t.equal(err?.headers['Retry-After'], '5');
  t.match(await node.storageHealth(), /^error: recovering: storage hung/);
  node.storageRecovering = null;
  t.equal(await node.storageHealth(), 'ok', 'control: ok once it is back');
});

t.test('a root that does not answer while the daemon does is given twice as long', async (t) => {
  const storage = new MockStorage();
  const { recoveries } = watch(t, storage, 300);
  storage.probeState = 'hung';
  storage.probeScope = 'only-mounts';
  await sleep(450);
  t.same(recoveries, [], 'not after hangMs');
  for (let i = 0; i < 100 && recoveries.length === 0; i++) await sleep(20);
  t.equal(recoveries.length, 1, 'restarted after twice hangMs');
});
t.test('the zfs gate: at most its limit at once, in the order they came, a failure frees its place', async (t) => {
  const gate = new Gate(2);
  let running = 0;
  let peak = 0;
  const started: number[] = [];
  const job = (i: number, fail = false) =>
    gate.run(async () => {
      started.push(i);
      peak = Math.max(peak, ++running);
      await sleep(10);
      running--;
      if (fail) throw new Error(`job ${i} failed`);
      return i;
    });
  const results = await Promise.allSettled([job(0), job(1, true), job(2), job(3, true), job(4), job(5)]);
  t.equal(peak, 2, 'never more than two at once');
  t.same(started, [0, 1, 2, 3, 4, 5], 'first come, first run');
  t.same(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
  t.same(gate.load, { active: 0, waiting: 0 }, 'every place given back, failed ones too');
  t.equal(await job(6), 6, 'and it still runs work');
});
