/**
 * Reconciliation (workers/reconcile.ts) against the mock drivers and a fresh sqlite file per
 * test: the db row is the truth, host objects are brought in line with it, and what no row
 * owns goes.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t, { type Test } from 'tap';
import { createDb, migrate } from '../db/knex';
import { boxesRepo, BoxRecord, BoxStatus } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { projectsRepo } from '../db/repos/projects';
import { loadConfig } from '../core/config';
import { createLogger } from '../core/logger';
import { newBoxId, newId, now } from '../core/ids';
import type { BaseRef } from '../core/box';
import { boxJobs } from '../jobs/boxJobs';
import { BoxSteps } from '../workers/boxSteps';
import type { WorkerContext } from '../workers/context';
import { createMockDrivers, MockDrivers } from '../workers/mockDrivers';
import { reconcile } from '../workers/reconcile';
import { startAgentWatchdog } from '../workers/agentWatchdog';

const BASE: BaseRef = { name: 'tiny', version: 'v1' };
const PROJECT = 'demo';

interface World extends MockDrivers {
  ctx: WorkerContext;
  /** Job states `jobState` answers, by operation id (`missing` when absent). */
  jobs: Map<string, string>;
  /** Inserts a box row of this node (or `node`), its project made if new. */
  insertBox(status: BoxStatus, node?: string): Promise<BoxRecord>;
  /** Gives a box its root and netns, as its create job would have. */
  makeHostObjects(box: BoxRecord): Promise<void>;
  insertOperation(box: BoxRecord): Promise<string>;
}

/** A node with its own db file and mock host, torn down with the test. */
async function world(t: Test): Promise<World> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-reconcile-'));
  const db = createDb({ dataDir, databaseUrl: undefined });
  t.teardown(async () => {
    await db.destroy();
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
  await migrate(db);
  const drivers = createMockDrivers();
  await drivers.storage.createBase(BASE, async () => undefined);
  const jobs = new Map<string, string>();
  const ctx: WorkerContext = {
    config: loadConfig({ BOXHOST_DATA_DIR: dataDir }, { readDotenv: false }),
    db,
    log: createLogger('silent'),
    ...drivers,
    boxes: new BoxSteps({ db, ...drivers }),
    jobState: async (id) => jobs.get(id) ?? 'missing',
  };
  return {
    ...drivers,
    ctx,
    jobs,
    async insertBox(status, node = ctx.config.nodeId) {
      await projectsRepo.ensure(db, PROJECT, 256);
      const at = now();
      const box: BoxRecord = {
        id: newBoxId(),
        project: PROJECT,
        name: `b${newBoxId()}`,
        status,
        error: null,
        base: `${BASE.name}@${BASE.version}`,
        fork: null,
        config: { cpus: 1, ram_mb: 256, region: 'local', storage_gb: 1 },
        environment: {},
        tags: {},
        data_mounts: [],
        lifecycle: null,
        pack: null,
        pack_rev: null,
        rollback_to: null,
        termination_grace_period_seconds: 0,
        url_settings: null,
        node,
        address: null,
        created_at: at,
        updated_at: at,
      };
      await boxesRepo.insert(db, box);
      return box;
    },
    async makeHostObjects(box) {
      await ctx.boxes.createRoot(box, { kind: 'base', base: BASE });
    },
    async insertOperation(box) {
      const id = newId('op');
      const at = now();
      await operationsRepo.insert(db, {
        id,
        kind: boxJobs.create.kind,
        status: 'queued',
        resource: `/v1/projects/${box.project}/boxes/${box.name}`,
        box_id: box.id,
        project: box.project,
        node: box.node,
        progress: null,
        error: null,
        payload: JSON.stringify({ boxId: box.id, source: { kind: 'base', base: BASE } }),
        created_by: null,
        created_at: at,
        updated_at: at,
      });
      return id;
    },
  };
}

const boxRow = async (w: World, id: string) => boxesRepo.byId(w.ctx.db, id);

t.test('a running box whose container vanished is started again', async (t) => {
  const w = await world(t);
  const box = await w.insertBox('running');
  await w.makeHostObjects(box);
  const report = await reconcile(w.ctx);
  t.same(report.restarted, [box.id]);
  t.same(report.failed, []);
  t.equal(await w.runtime.status(box.id), 'running');
  t.match(w.runtime.starts, [{ boxId: box.id, ramMb: 256 }]);
  t.match(await boxRow(w, box.id), { status: 'running', error: null, address: /^10\.250\.\d+\.2$/ });
});

t.test('a stopped box whose container runs is stopped', async (t) => {
  const w = await world(t);
  const box = await w.insertBox('running');
  await w.makeHostObjects(box);
  await w.ctx.boxes.start(box);
  await boxesRepo.update(w.ctx.db, box.id, { status: 'stopped' });
  const report = await reconcile(w.ctx);
  t.same(report.stopped, [box.id]);
  t.equal(await w.runtime.status(box.id), null, 'container gone');
  t.ok(await w.storage.hasBoxRoot(box.id), 'root kept');
  t.equal((await boxRow(w, box.id))?.status, 'stopped');
});

t.test('a box in a transitional status with no operation is failed as interrupted', async (t) => {
  const w = await world(t);
  const boxes: BoxRecord[] = [];
  for (const status of ['creating', 'stopping', 'resuming', 'deleting'] as const) boxes.push(await w.insertBox(status));
  const report = await reconcile(w.ctx);
  t.same([...report.failed].sort(), boxes.map((b) => b.id).sort());
  for (const box of boxes) {
    t.match(await boxRow(w, box.id), { status: 'failed', error: `interrupted while ${box.status}: its operation was lost` });
  }
});

t.test('a box with an unfinished operation is left to it', async (t) => {
  const w = await world(t);
  const asked: string[] = [];
  const jobState = w.ctx.jobState;
  w.ctx.jobState = async (id) => {
    asked.push(id);
    return jobState(id);
  };
  const box = await w.insertBox('creating');
  await w.makeHostObjects(box);
  const opId = await w.insertOperation(box);
  w.jobs.set(opId, 'waiting');

  const report = await reconcile(w.ctx);
  t.same(asked, [opId], 'its job was looked up');
  t.same(report, { lostOperations: [], restarted: [], stopped: [], failed: [], orphanContainers: [], orphanRoots: [], orphanNetworks: [], failedBuilds: [], repairedVolumes: [], failedBackups: [], orphanVolumes: [], movedAway: [] });
  t.match(await boxRow(w, box.id), { status: 'creating', error: null });
  t.match(await operationsRepo.get(w.ctx.db, opId), { status: 'queued', error: null });
  t.ok(await w.storage.hasBoxRoot(box.id), 'its half-made root stays');
  t.same(await w.network.listAttached(), [box.id], 'its netns stays');
});

t.test('an operation whose job is gone or ended fails as lost; one still queued or running stays', async (t) => {
  const w = await world(t);
  const cases: [string, boolean][] = [
    ['missing', true],
    ['failed', true],
    ['completed', true],
    ['waiting', false],
    ['delayed', false],
    ['active', false],
  ];
  const ops: { id: string; box: BoxRecord; state: string; lost: boolean }[] = [];
  for (const [state, lost] of cases) {
    const box = await w.insertBox('creating');
    const id = await w.insertOperation(box);
    if (state !== 'missing') w.jobs.set(id, state);
    ops.push({ id, box, state, lost });
  }
  const report = await reconcile(w.ctx);
  t.same([...report.lostOperations].sort(), ops.filter((o) => o.lost).map((o) => o.id).sort());
  for (const o of ops) {
    const op = await operationsRepo.get(w.ctx.db, o.id);
    if (o.lost) {
      t.match(op, { status: 'failed', error: `lost: its job is ${o.state}` }, `job ${o.state}: operation failed`);
      t.match(await boxRow(w, o.box.id), { status: 'failed', error: /^interrupted while creating/ }, `job ${o.state}: its box failed`);
    } else {
      t.match(op, { status: 'queued', error: null }, `job ${o.state}: operation kept`);
      t.equal((await boxRow(w, o.box.id))?.status, 'creating', `job ${o.state}: its box untouched`);
    }
  }
});

t.test('container, netns and root that no row owns are removed; owned ones stay', async (t) => {
  const w = await world(t);
  const owned = await w.insertBox('running');
  await w.makeHostObjects(owned);
  await w.ctx.boxes.start(owned);
  const orphan = newBoxId();
  await w.storage.createBoxRoot(orphan, { kind: 'base', base: BASE });
  await w.network.attach(orphan, { index: (await projectsRepo.get(w.ctx.db, PROJECT))!.net_index });
  await w.runtime.start({ boxId: orphan, hostname: 'x', rootfs: w.storage.boxRootPath(orphan), netnsPath: await w.network.prepare(orphan), cpus: 1, ramMb: 64, environment: {}, mounts: [] });

  const report = await reconcile(w.ctx);
  t.same(report.orphanContainers, [orphan]);
  t.same(report.orphanNetworks, [orphan]);
  t.same(report.orphanRoots, [orphan]);
  t.same(await w.runtime.list(), [{ boxId: owned.id, status: 'running' }]);
  t.same(await w.network.listAttached(), [owned.id]);
  t.same(await w.storage.listBoxRoots(), [owned.id]);
  t.equal(w.network.leasesOf((await projectsRepo.get(w.ctx.db, PROJECT))!.net_index).has(orphan), false, 'its address freed');
});

t.test('a running box whose root is gone ends failed, not started', async (t) => {
  const w = await world(t);
  const box = await w.insertBox('running');
  const report = await reconcile(w.ctx);
  t.same(report.failed, [box.id]);
  t.same(report.restarted, []);
  t.same(w.runtime.starts, [], 'no container started on a missing root');
  t.match(await boxRow(w, box.id), { status: 'failed', error: 'its root dataset is gone' });
});

t.test('a restart that fails leaves that box failed, and the other boxes are still repaired', async (t) => {
  const w = await world(t);
  const broken = await w.insertBox('running');
  await w.makeHostObjects(broken);
  const stopped = await w.insertBox('running');
  await w.makeHostObjects(stopped);
  await w.ctx.boxes.start(stopped);
  await boxesRepo.update(w.ctx.db, stopped.id, { status: 'stopped' });
  w.network.failAlways('attach', new Error('cni add: exit 1'));

  const report = await reconcile(w.ctx);
  t.same(report.failed, [broken.id]);
  t.same(report.stopped, [stopped.id]);
  t.match(await boxRow(w, broken.id), { status: 'failed', error: 'cni add: exit 1' });
  t.equal(await w.runtime.status(stopped.id), null);
});

t.test("boxes and operations of another node are not this node's to judge", async (t) => {
  const w = await world(t);
  const elsewhere = await w.insertBox('creating', 'other-node');
  // Its job is on the other node's queue, which this node's `jobState` cannot see.
  const opId = await w.insertOperation(elsewhere);
  const runningThere = await w.insertBox('running', 'other-node');
  const report = await reconcile(w.ctx);
  t.same(report.lostOperations, []);
  t.same(report.restarted, []);
  t.same(report.failed, []);
  t.same(w.runtime.starts, []);
  t.match(await operationsRepo.get(w.ctx.db, opId), { status: 'queued', error: null });
  t.match(await boxRow(w, elsewhere.id), { status: 'creating', error: null });
  t.match(await boxRow(w, runningThere.id), { status: 'running', error: null });
});

t.test('the agent watchdog restarts a box whose boxd stopped answering or whose container died, and only those', async (t) => {
  const w = await world(t);
  const make = async () => {
    const b = await w.insertBox('running');
    await w.makeHostObjects(b);
    await w.ctx.boxes.start(b);
    return b;
  };
  const [healthy, wedged, dead, busy] = [await make(), await make(), await make(), await make()];
  const stopped = await w.insertBox('stopped');
  await w.makeHostObjects(stopped);
  w.runtime.wedgedAgents.add(wedged.id);
  w.runtime.wedgedAgents.add(busy.id);
  await w.runtime.stop(dead.id, 0);
  await w.insertOperation(busy); // an operation is under way: the watchdog keeps out
  const startsBefore = w.runtime.starts.length;
  const dog = startAgentWatchdog({ ctx: w.ctx, intervalMs: 20, timeoutMs: 50, misses: 2 });
  t.teardown(() => dog.stop());
  const until = Date.now() + 5000;
  while (dog.restarted.length < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
  // A restarted box gets a new boxd: the mock's agent answers again once unwedged.
  w.runtime.wedgedAgents.delete(wedged.id);
  await new Promise((r) => setTimeout(r, 200));
  await dog.stop();
  t.same([...dog.restarted].sort(), [wedged.id, dead.id].sort(), 'the wedged box and the dead one were restarted, once each');
  t.equal(await w.runtime.status(dead.id), 'running', 'the dead box runs again');
  t.equal(await w.runtime.status(busy.id), 'running', 'the box with an operation was left alone');
  t.equal(await w.runtime.status(stopped.id), null, 'a stopped box stays stopped');
  t.equal(w.runtime.starts.length - startsBefore, 2, 'two starts, no more');
  t.notOk(dog.restarted.includes(healthy.id), 'the healthy box was not touched');
});

t.test('the agent watchdog looks at nothing while the node says it is busy (storage recovery)', async (t) => {
  const w = await world(t);
  const b = await w.insertBox('running');
  await w.makeHostObjects(b);
  const dog = startAgentWatchdog({ ctx: w.ctx, intervalMs: 20, timeoutMs: 50, paused: () => true });
  await new Promise((r) => setTimeout(r, 200));
  await dog.stop();
  t.same(dog.restarted, [], 'a box whose container is gone is left to the recovery');
  t.equal(await w.runtime.status(b.id), null);
});
