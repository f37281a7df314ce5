/**
 * The box job handlers run directly (no Redis, no worker) against BoxSteps over the mock
 * drivers and a real sqlite file: what each job leaves in the row and on the host, including
 * retries after a fault and the `onFailed` cleanup after the last attempt.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { UnrecoverableError } from 'bullmq';
import { createDb, migrate } from '../db/knex';
import { boxesRepo, BoxRecord } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import { createLogger } from '../core/logger';
import { newBoxId, newId, now } from '../core/ids';
import { projectIdMap, type BaseRef } from '../core/box';
import type { JobContext, JobHandler } from '../jobs/types';
import type { BaseHost, BoxHost, VolumeHost } from '../jobs/ports';
import type { BoxRef } from '../jobs/boxJobs';
import { createBoxJob } from '../jobs/boxCreate';
import { stopBoxJob } from '../jobs/boxStop';
import { resumeBoxJob } from '../jobs/boxResume';
import { deleteBoxJob } from '../jobs/boxDelete';
import { snapshotBoxJob } from '../jobs/boxSnapshot';
import { restoreBoxJob } from '../jobs/boxRestore';
import { StorageInUseError } from '../workers/storage/zfs';
import { BoxSteps } from '../workers/boxSteps';
import { createMockDrivers } from '../workers/mockDrivers';
import { BaseSteps, stagedFile } from '../workers/baseSteps';
import { saveBaseJob } from '../jobs/baseSave';
import { importBaseJob } from '../jobs/baseImport';
import { basesRepo, NO_META } from '../db/repos/bases';

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-jobs-'));
const db = createDb({ dataDir, databaseUrl: undefined });
const log = createLogger('silent');
const BASE: BaseRef = { name: 'tiny', version: 'v1' };
const fromBase = { kind: 'base' as const, base: BASE };

t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

/** A mock host with one base, and the box steps the jobs run on it. */
async function host() {
  const drivers = createMockDrivers();
  await drivers.storage.createBase(BASE, async (dir) => fs.promises.writeFile(path.join(dir, 'hello'), 'hi'));
  return { ...drivers, steps: new BoxSteps({ db, ...drivers }) };
}
type Host = Awaited<ReturnType<typeof host>>;

/** A box row as the api inserts it for a create (status `creating`), in a project of its own
 *  unless given one. */
async function insertBox(patch: Partial<BoxRecord> = {}): Promise<BoxRecord> {
  const project = patch.project ?? `p${newBoxId()}`;
  await projectsRepo.ensure(db, project, 256);
  const at = now();
  const box: BoxRecord = {
    id: newBoxId(),
    project,
    name: 'web',
    status: 'creating',
    error: null,
    base: `${BASE.name}@${BASE.version}`,
    fork: null,
    config: { cpus: 1, ram_mb: 512, region: 'local', storage_gb: 3 },
    environment: { GREETING: 'hi' },
    tags: {},
    data_mounts: [],
    lifecycle: null,
    pack: null,
    pack_rev: null,
    rollback_to: null,
    termination_grace_period_seconds: 10,
    url_settings: null,
    node: 'local',
    address: null,
    created_at: at,
    updated_at: at,
    ...patch,
  };
  await boxesRepo.insert(db, box);
  return box;
}

const row = async (id: string) => boxesRepo.byId(db, id);
const netIndex = async (project: string) => (await projectsRepo.get(db, project))!.net_index;

/** Box jobs never reach base steps: any call fails the test. */
const noBases: BaseHost = new Proxy({} as BaseHost, { get: (_t, p) => () => Promise.reject(new Error(`a box job called base step ${String(p)}`)) });

const noVolumes: VolumeHost = new Proxy({} as VolumeHost, { get: (_t, p) => () => Promise.reject(new Error(`a box job called volume step ${String(p)}`)) });

function jobContext<P>(node: BoxHost, payload: P, attempt: number, attempts: number, progress: number[] = [], bases: BaseHost = noBases, volumes: VolumeHost = noVolumes): JobContext<P> {
  return {
    bases,
    volumes,
    payload,
    operationId: newId('op'),
    attempt,
    lastAttempt: attempt >= attempts,
    db,
    log,
    node,
    progress: async (p) => {
      progress.push(p);
    },
  };
}

/** Runs a handler as the worker does: again after each failure, `onFailed` after the last
 *  attempt. Answers how many attempts ran and the last error, if it failed for good. */
async function runLikeWorker<P>(handler: JobHandler<P>, payload: P, node: BoxHost, attempts = 5, bases?: BaseHost): Promise<{ attempts: number; error?: Error }> {
  for (let attempt = 1; ; attempt++) {
    const ctx = jobContext(node, payload, attempt, attempts, [], bases);
    try {
      await handler.run(ctx);
      return { attempts: attempt };
    } catch (e) {
      // As the worker: an UnrecoverableError (JobRefused) is final at once.
      if (!ctx.lastAttempt && !(e instanceof UnrecoverableError)) continue;
      await handler.onFailed?.(ctx, e as Error);
      return { attempts: attempt, error: e as Error };
    }
  }
}

/** A box made running by its create job. */
async function runningBox(h: Host): Promise<BoxRecord> {
  const box = await insertBox();
  const r = await runLikeWorker(createBoxJob, { boxId: box.id, source: fromBase }, h.steps);
  if (r.error) throw r.error;
  return (await row(box.id))!;
}

t.test('create: creating → running, with its root, container and address', async (t) => {
  const h = await host();
  const box = await insertBox();
  const progress: number[] = [];
  await createBoxJob.run(jobContext(h.steps, { boxId: box.id, source: fromBase }, 1, 5, progress));

  const after = (await row(box.id))!;
  t.equal(after.status, 'running');
  t.equal(after.error, null);
  t.equal(after.address, `10.250.${await netIndex(box.project)}.2`, 'the first address of its project network');
  t.same(h.storage.root(box.id), { source: fromBase, base: BASE, storageGb: 3, idMap: projectIdMap(await netIndex(box.project)), snapshots: new Map() }, 'root cloned from the base with its quota, in the project\'s id range');
  t.equal(await h.runtime.status(box.id), 'running');
  t.same(await h.network.listAttached(), [box.id]);
  t.equal(h.runtime.starts.length, 1);
  t.match(h.runtime.starts[0], {
    boxId: box.id,
    hostname: 'web',
    rootfs: h.storage.boxRootPath(box.id),
    netnsPath: await h.network.prepare(box.id),
    cpus: 1,
    ramMb: 512,
    environment: { GREETING: 'hi' },
  });
  t.same(progress, [50]);
});

t.test('create runs again after a fault in its start step, and a second run changes nothing', async (t) => {
  const h = await host();
  const box = await insertBox();
  h.runtime.failNext('start', new Error('runc run: boom'));
  const r = await runLikeWorker(createBoxJob, { boxId: box.id, source: fromBase }, h.steps);
  t.same(r, { attempts: 2 }, 'the first attempt failed, the retry succeeded');
  const first = (await row(box.id))!;
  t.equal(first.status, 'running');

  await createBoxJob.run(jobContext(h.steps, { boxId: box.id, source: fromBase }, 1, 5));
  t.same(await h.storage.listBoxRoots(), [box.id], 'one root');
  t.same(await h.runtime.list(), [{ boxId: box.id, status: 'running' }], 'one container');
  t.equal(h.runtime.starts.length, 1, 'started once');
  t.same([...h.network.leasesOf(await netIndex(box.project)).keys()], [box.id], 'one address');
  t.equal((await row(box.id))!.address, first.address, 'the same address');
});

t.test('create of a box deleted before its turn does nothing', async (t) => {
  const h = await host();
  await createBoxJob.run(jobContext(h.steps, { boxId: newBoxId(), source: fromBase }, 1, 5));
  t.same(await h.storage.listBoxRoots(), []);
  t.same(await h.network.listAttached(), []);
  t.same(h.runtime.starts, []);
});

t.test('create of a box deleted while its root was made: nothing is started or wired', async (t) => {
  const h = await host();
  const box = await insertBox();
  // The start's preparation runs beside the clone; the delete lands before the clone ends.
  const clone = h.storage.createBoxRoot.bind(h.storage);
  h.storage.createBoxRoot = async (...args: Parameters<typeof clone>) => {
    const made = await clone(...args);
    await boxesRepo.update(db, box.id, { status: 'deleting' });
    return made;
  };
  const progress: number[] = [];
  await createBoxJob.run(jobContext(h.steps, { boxId: box.id, source: fromBase }, 1, 5, progress));
  t.same(h.runtime.starts, [], 'no container');
  t.same([...h.network.leasesOf(await netIndex(box.project)).keys()], [], 'not wired: no address');
  t.equal((await row(box.id))!.status, 'deleting', 'the row is left to its delete');
  t.same(progress, [50], 'the progress still says the root was made');
});

t.test('create whose clone fails: the start beside it runs nothing and the failure is the clone\'s', async (t) => {
  const h = await host();
  const box = await insertBox();
  h.storage.failNext('createBoxRoot', new Error('zfs clone: out of space'));
  const err = await createBoxJob.run(jobContext(h.steps, { boxId: box.id, source: fromBase }, 1, 5)).then(() => null, (e: Error) => e);
  t.match(err?.message, /zfs clone: out of space/);
  t.same(h.runtime.starts, [], 'no container');
  t.same([...h.network.leasesOf(await netIndex(box.project)).keys()], [], 'not wired: no address');
  t.same(await h.storage.listBoxRoots(), [], 'no root');
});

t.test('create failed for good: onFailed removes what was made, the row stays failed', async (t) => {
  const h = await host();
  // An earlier attempt got as far as recording an address.
  const box = await insertBox({ address: '10.250.0.99' });
  // Root, netns and container are made; joining the bridge fails every time.
  h.network.failAlways('attach', new Error('cni bridge: no such device'));
  const r = await runLikeWorker(createBoxJob, { boxId: box.id, source: fromBase }, h.steps, 3);
  t.equal(r.attempts, 3);
  t.equal(h.runtime.starts.length, 1, 'the container had been started');

  const after = (await row(box.id))!;
  t.equal(after.status, 'failed');
  t.equal(after.error, 'create failed: cni bridge: no such device');
  t.equal(after.address, null);
  t.same(await h.storage.listBoxRoots(), [], 'root removed');
  t.same(await h.runtime.list(), [], 'container removed');
  t.same(await h.network.listAttached(), [], 'netns removed');
});

t.test('create failed for good while its cleanup fails too: still failed with the reason', async (t) => {
  const h = await host();
  const box = await insertBox();
  h.network.failAlways('attach', new Error('cni add: exit 1'));
  h.storage.failAlways('destroyBoxRoot', new Error('dataset is busy'));
  const r = await runLikeWorker(createBoxJob, { boxId: box.id, source: fromBase }, h.steps, 2);
  t.equal(r.error?.message, 'cni add: exit 1');
  t.match(await row(box.id), { status: 'failed', error: 'create failed: cni add: exit 1', address: null });
  t.same(await h.runtime.list(), [], 'what could be removed was');
});

t.test('stop: running → stopped, container gone, root kept', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  t.match(await row(box.id), { status: 'stopped', error: null, address: box.address });
  t.equal(await h.runtime.status(box.id), null, 'container gone');
  t.ok(await h.storage.hasBoxRoot(box.id), 'root kept');
});

t.test('stop shows stopping while it runs, and a retry finishes it', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  h.runtime.failNext('stop', new Error('runc kill: boom'));
  await t.rejects(stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5)), /boom/);
  t.equal((await row(box.id))!.status, 'stopping');
  t.equal(await h.runtime.status(box.id), 'running');
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 2, 5));
  t.equal((await row(box.id))!.status, 'stopped');
});

t.test('resume: stopped → running with the config the row has now', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  await boxesRepo.update(db, box.id, { config: { ...box.config, ram_mb: 1024 }, environment: { GREETING: 'hello' } });

  await resumeBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  t.match(await row(box.id), { status: 'running', error: null, address: box.address });
  t.equal(await h.runtime.status(box.id), 'running');
  t.equal(h.runtime.starts.length, 2);
  t.match(h.runtime.starts[1], { boxId: box.id, ramMb: 1024, environment: { GREETING: 'hello' } });
  t.equal(h.runtime.starts[0].ramMb, 512, 'the first start had the old config');
});

t.test('a stop or resume run again after its host died past its last step ends as done; a first run there is refused', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  // The resume's earlier run started the box and wrote `running`; the host died before the
  // operation was marked succeeded, and the worker runs it again.
  const rerun = { ...jobContext(h.steps, { boxId: box.id }, 1, 5), rerun: true };
  await resumeBoxJob.run(rerun);
  t.match(await row(box.id), { status: 'running', error: null }, 'the box is left running');
  t.equal(h.runtime.starts.length, 1, 'and not started again');
  // Positive control: a resume that never ran before, on a running box, is refused.
  await t.rejects(resumeBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5)), /box is running; cannot resume it/);
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  await stopBoxJob.run({ ...jobContext(h.steps, { boxId: box.id }, 1, 5), rerun: true });
  t.match(await row(box.id), { status: 'stopped' }, 'a stop run again on a stopped box: done');
  await t.rejects(stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5)), /box is stopped; cannot stop it/);
});

t.test('delete: everything on the host goes, then the row', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  const index = await netIndex(box.project);
  t.equal(h.network.leasesOf(index).size, 1);
  await deleteBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  t.equal(await row(box.id), undefined, 'row removed');
  t.same(await h.runtime.list(), []);
  t.same(await h.storage.listBoxRoots(), []);
  t.same(await h.network.listAttached(), []);
  t.equal(h.network.leasesOf(index).size, 0, 'address freed');
});

t.test('stop, resume and delete of a box already gone are no-ops', async (t) => {
  const h = await host();
  const other = await runningBox(h);
  const gone = await runningBox(h);
  await deleteBoxJob.run(jobContext(h.steps, { boxId: gone.id }, 1, 5));
  // Any driver call would throw now: the jobs must not touch the host.
  h.runtime.failAlways('remove', new Error('touched runtime'));
  h.runtime.failAlways('stop', new Error('touched runtime'));
  h.runtime.failAlways('start', new Error('touched runtime'));
  h.storage.failAlways('destroyBoxRoot', new Error('touched storage'));
  for (const job of [stopBoxJob, resumeBoxJob, deleteBoxJob]) {
    await job.run(jobContext(h.steps, { boxId: gone.id }, 1, 5));
  }
  t.equal(await row(gone.id), undefined);
  t.match(await row(other.id), { status: 'running' }, 'the other box is untouched');
  t.same(await h.storage.listBoxRoots(), [other.id]);
  t.same(await h.runtime.list(), [{ boxId: other.id, status: 'running' }]);
});

t.test('a transition failed for good leaves the box failed with "<action> failed: …"', async (t) => {
  const cases: { job: JobHandler<BoxRef>; action: string; stoppedFirst: boolean; fault(h: Host): void }[] = [
    { job: stopBoxJob, action: 'stop', stoppedFirst: false, fault: (h) => h.runtime.failAlways('stop', new Error('runc kill timed out')) },
    { job: resumeBoxJob, action: 'resume', stoppedFirst: true, fault: (h) => h.network.failAlways('attach', new Error('cni add: exit 1')) },
    { job: deleteBoxJob, action: 'delete', stoppedFirst: false, fault: (h) => h.storage.failAlways('destroyBoxRoot', new Error('dataset is busy')) },
  ];
  for (const c of cases) {
    const h = await host();
    const box = await runningBox(h);
    if (c.stoppedFirst) await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
    c.fault(h);
    const r = await runLikeWorker(c.job, { boxId: box.id }, h.steps, 3);
    t.equal(r.attempts, 3, `${c.action}: every attempt ran`);
    t.ok(r.error, `${c.action}: failed for good`);
    const after = await row(box.id);
    t.equal(after?.status, 'failed', `${c.action}: the box is failed`);
    t.equal(after?.error, `${c.action} failed: ${r.error?.message}`, `${c.action}: with why`);
  }
});

t.test('a stop queued behind a create that then failed is refused and leaves the box failed', async (t) => {
  const h = await host();
  const box = await insertBox();
  h.network.failAlways('attach', new Error('cni bridge: no such device'));
  await runLikeWorker(createBoxJob, { boxId: box.id, source: fromBase }, h.steps, 2);
  h.network.heal();
  const r = await runLikeWorker(stopBoxJob, { boxId: box.id }, h.steps);
  t.equal(r.attempts, 1, 'refused at once, no retries');
  t.match(r.error?.message, /^box is failed \(create failed: cni bridge: no such device\); cannot stop it$/);
  t.match(await row(box.id), { status: 'failed', error: 'create failed: cni bridge: no such device' }, 'the reason is kept');
  const retried = await runLikeWorker(deleteBoxJob, { boxId: box.id }, h.steps);
  t.equal(retried.error, undefined, 'a failed box can still be deleted');
  t.equal(await row(box.id), undefined);
});

t.test('snapshot: a running box is paused for it and resumed, also when the snapshot fails', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  const paused: (string | null)[] = [];
  const take = h.storage.snapshotBoxRoot.bind(h.storage);
  h.storage.snapshotBoxRoot = async (id, name, description) => {
    paused.push(await h.runtime.status(id));
    return take(id, name, description);
  };
  await snapshotBoxJob.run(jobContext(h.steps, { boxId: box.id, name: 's1', description: 'first' }, 1, 5));
  t.same(paused, ['paused'], 'the container was paused while the snapshot was taken');
  t.equal(await h.runtime.status(box.id), 'running', 'and runs after');
  t.match(await h.storage.listBoxSnapshots(box.id), [{ name: 's1', description: 'first' }]);
  t.equal((await row(box.id))!.status, 'running', 'the status never changed');

  h.storage.failNext('snapshotBoxRoot', new Error('zfs snapshot: out of space'));
  await t.rejects(snapshotBoxJob.run(jobContext(h.steps, { boxId: box.id, name: 's2' }, 1, 5)), /out of space/);
  t.equal(await h.runtime.status(box.id), 'running', 'a failed snapshot still resumes the box');
  await snapshotBoxJob.run(jobContext(h.steps, { boxId: box.id, name: 's2' }, 2, 5));
  await snapshotBoxJob.run(jobContext(h.steps, { boxId: box.id, name: 's2' }, 3, 5));
  t.same((await h.storage.listBoxSnapshots(box.id)).map((s) => s.name), ['s1', 's2'], 'a retry after success changes nothing');

  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  await snapshotBoxJob.run(jobContext(h.steps, { boxId: box.id, name: 'cold' }, 1, 5));
  t.equal(await h.runtime.status(box.id), null, 'a stopped box stays stopped');

  await boxesRepo.update(db, box.id, { status: 'deleting' });
  const refused = await runLikeWorker(snapshotBoxJob, { boxId: box.id, name: 'late' }, h.steps);
  t.equal(refused.attempts, 1, 'a box on its way out: refused at once');
  t.match(refused.error?.message, /is deleting/);
});

t.test('restore: stop, roll back, start; refused before anything when later snapshots depend on it', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  await h.steps.snapshot(box, 's1');
  await h.steps.snapshot(box, 's2');
  const refused = await runLikeWorker(restoreBoxJob, { boxId: box.id, snapshot: 's1' }, h.steps);
  t.equal(refused.attempts, 1, 'refused at once');
  t.match(refused.error?.message, /snapshot s2 made after it would be lost/);
  t.match(await row(box.id), { status: 'running', error: null }, 'the box is left as it was');
  t.equal(await h.runtime.status(box.id), 'running', 'still running');
  t.same(h.storage.rollbacks, []);

  const starts = h.runtime.starts.length;
  await restoreBoxJob.run(jobContext(h.steps, { boxId: box.id, snapshot: 's2' }, 1, 5));
  t.same(h.storage.rollbacks, [`${box.id}@s2`]);
  t.equal(h.runtime.starts.length, starts + 1, 'started again');
  t.match(await row(box.id), { status: 'running', error: null });

  // A fault after the status changed: restoring until a retry finishes it.
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  h.storage.failNext('rollbackBoxRoot', new Error('dataset is busy'));
  await t.rejects(restoreBoxJob.run(jobContext(h.steps, { boxId: box.id, snapshot: 's2' }, 1, 5)), /busy/);
  t.equal((await row(box.id))!.status, 'restoring');
  await restoreBoxJob.run(jobContext(h.steps, { boxId: box.id, snapshot: 's2' }, 2, 5));
  t.match(await row(box.id), { status: 'running' }, 'a stopped box comes back running');
  t.equal(await h.runtime.status(box.id), 'running');

  const gone = await runLikeWorker(restoreBoxJob, { boxId: box.id, snapshot: 'nope' }, h.steps);
  t.match(gone.error?.message, /has no snapshot nope/);
  t.equal((await row(box.id))!.status, 'running');
});

t.test('a refused restore never leaves the box restoring, nor stopped when it ran', async (t) => {
  const h = await host();
  const box = await runningBox(h);
  await h.steps.snapshot(box, 's1');
  await h.steps.snapshot(box, 's2');
  // As the api queues it with nothing ahead: the box shows restoring at once.
  await boxesRepo.update(db, box.id, { status: 'restoring' });
  const refused = await runLikeWorker(restoreBoxJob, { boxId: box.id, snapshot: 's1', from: 'running' }, h.steps);
  t.equal(refused.attempts, 1);
  t.match(refused.error?.message, /snapshot s2 made after it would be lost/);
  t.match(await row(box.id), { status: 'running', error: null }, 'back to running');
  t.equal(await h.runtime.status(box.id), 'running');

  // A blocker that appears after the job's check: the rollback refuses after the stop; the box
  // runs again and shows running.
  await boxesRepo.update(db, box.id, { status: 'restoring' });
  h.storage.failNext('rollbackBoxRoot', new StorageInUseError('box has fork x after s2', ['fork x']));
  const late = await runLikeWorker(restoreBoxJob, { boxId: box.id, snapshot: 's2', from: 'running' }, h.steps);
  t.equal(late.attempts, 1, 'refused, not retried');
  t.match(late.error?.message, /were made after it meanwhile; nothing was changed/);
  t.match(await row(box.id), { status: 'running', error: null });
  t.equal(await h.runtime.status(box.id), 'running', 'started again');
  t.same(h.storage.rollbacks, [], 'nothing rolled back');

  // One asked for while stopped stays stopped.
  await stopBoxJob.run(jobContext(h.steps, { boxId: box.id }, 1, 5));
  await boxesRepo.update(db, box.id, { status: 'restoring' });
  const cold = await runLikeWorker(restoreBoxJob, { boxId: box.id, snapshot: 's1', from: 'stopped' }, h.steps);
  t.ok(cold.error);
  t.match(await row(box.id), { status: 'stopped' });
  t.equal(await h.runtime.status(box.id), null);
});

t.test('base save: made once (a fault retried), the hold dropped, the box thawed; refused and failed saves leave nothing', async (t) => {
  const h = await host();
  const bases = new BaseSteps({ storage: h.storage, runtime: h.runtime, stagingDir: dataDir, limits: { maxUnpackedBytes: 1 << 20 } });
  const box = await runningBox(h);
  const reserve = (version: string) => basesRepo.reserve(db, { name: 'saved', version, origin: 'saved', project: box.project, node: 'local', sha256: null, created_by: 't', ...NO_META });

  await reserve('aaaaaaaaaaaa');
  h.storage.failNext('baseFromBoxRoot', new Error('a disk hiccup'));
  const ok = await runLikeWorker(saveBaseJob, { boxId: box.id, name: 'saved', version: 'aaaaaaaaaaaa' }, h.steps, 5, bases);
  t.same(ok, { attempts: 2 }, 'the retry made it');
  t.equal((await basesRepo.getAny(db, 'saved', 'aaaaaaaaaaaa'))?.state, 'ready');
  t.ok(await h.storage.hasBase({ name: 'saved', version: 'aaaaaaaaaaaa' }));
  t.same(h.storage.heldRoots, [], 'the hold is dropped');
  t.equal(await h.runtime.status(box.id), 'running', 'the box is not left paused');

  await reserve('bbbbbbbbbbbb');
  const gone = await runLikeWorker(saveBaseJob, { boxId: 'nosuchbox', name: 'saved', version: 'bbbbbbbbbbbb' }, h.steps, 5, bases);
  t.match(gone.error?.message, /deleted before it was saved/);
  t.equal(gone.attempts, 1, 'refused at once');
  t.equal(await basesRepo.getAny(db, 'saved', 'bbbbbbbbbbbb'), undefined, 'the making record is gone');

  await reserve('cccccccccccc');
  h.storage.failAlways('baseFromBoxRoot', new Error('the pool is full'));
  const failed = await runLikeWorker(saveBaseJob, { boxId: box.id, name: 'saved', version: 'cccccccccccc' }, h.steps, 3, bases);
  h.storage.heal();
  t.match(failed.error?.message, /pool is full/);
  t.equal(failed.attempts, 3);
  t.same(h.storage.heldRoots, [], 'the hold of a failed save is released');
  t.equal(await basesRepo.getAny(db, 'saved', 'cccccccccccc'), undefined);
  t.notOk(await h.storage.hasBase({ name: 'saved', version: 'cccccccccccc' }));
  t.equal(await h.runtime.status(box.id), 'running');
});

t.test('base import: unpacks the staged upload once, then drops it; a failure drops upload, base and record', async (t) => {
  const h = await host();
  const bases = new BaseSteps({ storage: h.storage, runtime: h.runtime, stagingDir: dataDir, limits: { maxUnpackedBytes: 1 << 20 } });
  const { archive } = await import('./helpers/tarball');
  const reserve = (version: string) => basesRepo.reserve(db, { name: 'imp', version, origin: 'imported', project: null, node: 'local', sha256: null, created_by: 't', ...NO_META });
  const token = 'a'.repeat(32);
  fs.writeFileSync(stagedFile(dataDir, token), archive([{ path: 'etc/hello', body: 'hi' }]));
  await reserve('dddddddddddd');
  h.storage.failNext('createBase', new Error('a disk hiccup'));
  t.same(await runLikeWorker(importBaseJob, { name: 'imp', version: 'dddddddddddd', token }, h.steps, 5, bases), { attempts: 2 });
  t.equal((await basesRepo.getAny(db, 'imp', 'dddddddddddd'))?.state, 'ready');
  t.notOk(fs.existsSync(stagedFile(dataDir, token)), 'the upload is removed');

  const bad = 'b'.repeat(32);
  fs.writeFileSync(stagedFile(dataDir, bad), archive([{ path: '/etc/passwd', body: 'x' }]));
  await reserve('eeeeeeeeeeee');
  const failed = await runLikeWorker(importBaseJob, { name: 'imp', version: 'eeeeeeeeeeee', token: bad }, h.steps, 2, bases);
  t.match(failed.error?.message, /absolute path/, 'the extractor refuses what the scan would have');
  t.notOk(fs.existsSync(stagedFile(dataDir, bad)));
  t.equal(await basesRepo.getAny(db, 'imp', 'eeeeeeeeeeee'), undefined);
  t.notOk(await h.storage.hasBase({ name: 'imp', version: 'eeeeeeeeeeee' }));
});
