/**
 * The data volume job handlers run directly (no Redis, no worker) on VolumeSteps over the mock
 * volume driver and a real sqlite file: create and its cleanup, backups (full, then incremental
 * on the newest backup still on the volume; a retry sends the same stream; a failure cleans up),
 * restores (the chain, a corrupt or missing stream refused before the volume is touched, a box
 * running with it refused), moves to another node (restore there, the old node lets its dataset
 * go when it looks, not while a move back is under way).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { UnrecoverableError } from 'bullmq';
import { createDb, migrate } from '../db/knex';
import { createLogger } from '../core/logger';
import { CommandError } from '../core/command';
import { newId, now } from '../core/ids';
import type { JobContext, JobHandler } from '../jobs/types';
import type { BaseHost, BoxHost, VolumeHost } from '../jobs/ports';
import { volumesRepo, type BackupRow } from '../db/repos/volumes';
import { boxesRepo } from '../db/repos/boxes';
import { createDataJob } from '../jobs/dataVolume';
import { backupDataJob } from '../jobs/dataBackup';
import { restoreDataJob } from '../jobs/dataRestore';
import { MockVolumes } from '../workers/storage/mockVolumes';
import { backupFiles, VolumeSteps } from '../workers/volumeSteps';
import { generatedBackupName } from '../domain/volumeData';
import { reconcileVolumes } from '../workers/reconcileVolumes';
import { sweepEvictions } from '../workers/volumeEvictions';
import type { WorkerContext } from '../workers/context';

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-data-'));
const backupDir = path.join(dataDir, 'backups');
const db = createDb({ dataDir, databaseUrl: undefined });
const log = createLogger('silent');
const refuse = <T extends object>(what: string) => new Proxy({} as T, { get: (_t, p) => () => Promise.reject(new Error(`a data job called ${what} step ${String(p)}`)) });

t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

function ctxOf<P>(volumes: VolumeHost, payload: P, attempt: number, attempts: number, operationId: string): JobContext<P> {
  return { payload, operationId, attempt, lastAttempt: attempt >= attempts, db, log, node: refuse<BoxHost>('box'), bases: refuse<BaseHost>('base'), volumes, progress: async () => undefined };
}

async function runLikeWorker<P>(handler: JobHandler<P>, payload: P, volumes: VolumeHost, attempts = 5): Promise<{ attempts: number; error?: Error }> {
  const operationId = newId('op');
  for (let attempt = 1; ; attempt++) {
    const ctx = ctxOf(volumes, payload, attempt, attempts, operationId);
    try {
      await handler.run(ctx);
      return { attempts: attempt };
    } catch (e) {
      if (!ctx.lastAttempt && !(e instanceof UnrecoverableError)) continue;
      await handler.onFailed?.(ctx, e as Error);
      return { attempts: attempt, error: e as Error };
    }
  }
}

let n = 0;
async function volume(mock: MockVolumes, steps: VolumeSteps) {
  const id = `vunit${++n}`;
  const at = now();
  await volumesRepo.insert(db, { id, name: `unit-${n}`, project: null, node: 'n1', state: 'creating', quota_gb: 1, description: null, size_bytes: 0, created_by: null, created_at: at, updated_at: at });
  const r = await runLikeWorker(createDataJob, { volumeId: id, quotaGb: 1 }, steps);
  if (r.error) throw r.error;
  return { id, set: (data: string) => void (mock.volumes.get(id)!.data = data), get: () => mock.volumes.get(id)!.data };
}

async function backup(volumeId: string, name: string): Promise<BackupRow> {
  const at = now();
  const row: BackupRow = { id: newId('bk'), volume_id: volumeId, name, status: 'pending', mode: null, parent: null, description: null, error: null, sha256: null, size_bytes: null, created_at: at, updated_at: at };
  await volumesRepo.insertBackup(db, row);
  return row;
}

const fresh = (nodeId = 'n1') => {
  const mock = new MockVolumes();
  return { mock, steps: new VolumeSteps({ volumes: mock, backupDir, nodeId }) };
};

t.test('create: ready with its dataset; failed for good, the dataset and the row go', async (t) => {
  const { mock, steps } = fresh();
  const v = await volume(mock, steps);
  t.equal((await volumesRepo.byId(db, v.id))?.state, 'ready');
  t.ok(mock.volumes.has(v.id));
  mock.failAlways('createVolume', new Error('zfs create exited 1: out of space'));
  const at = now();
  await volumesRepo.insert(db, { id: 'vunitbad', name: 'unit-bad', project: null, node: 'n1', state: 'creating', quota_gb: 1, description: null, size_bytes: 0, created_by: null, created_at: at, updated_at: at });
  const r = await runLikeWorker(createDataJob, { volumeId: 'vunitbad', quotaGb: 1 }, steps, 2);
  t.ok(r.error, 'it failed');
  t.equal(await volumesRepo.byId(db, 'vunitbad'), undefined, 'the row is gone');
  t.notOk(mock.volumes.has('vunitbad'));
});

t.test('backups: full, then incremental on the newest still on the volume; a retry is the same stream', async (t) => {
  const { mock, steps } = fresh();
  const v = await volume(mock, steps);
  v.set('one');
  const a = await backup(v.id, 'a');
  mock.failNext('sendBackup', new Error('zfs send exited 1: broken pipe'));
  t.same(await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: a.id }, steps), { attempts: 2 }, 'retried once');
  t.match(await volumesRepo.backupById(db, a.id), { status: 'completed', mode: 'full', parent: null });
  v.set('two');
  const b = await backup(v.id, 'b');
  await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: b.id }, steps);
  t.match(await volumesRepo.backupById(db, b.id), { status: 'completed', mode: 'incremental', parent: 'a' });
  t.notOk(await mock.hasBackupSnapshot(v.id, 'a'), "older backups' snapshots are pruned (they would hold blocks against the quota)");
  t.ok(await mock.hasBackupSnapshot(v.id, 'b'), "the newest one's stays: the next incremental's base");
  // A rollback that took b's snapshot away: the next one is full again.
  await mock.dropBackupSnapshot(v.id, 'b');
  const c = await backup(v.id, 'c');
  await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: c.id }, steps);
  t.match(await volumesRepo.backupById(db, c.id), { mode: 'full', parent: null });
  const d = await backup(v.id, 'd');
  await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: d.id }, steps);
  t.match(await volumesRepo.backupById(db, d.id), { mode: 'incremental', parent: 'c' });

  // A failure for good: failed with a public reason, its partial file and snapshot gone.
  const e = await backup(v.id, 'e');
  mock.failAlways('sendBackup', new CommandError(['/usr/sbin/zfs', 'send', 'boxhost/data/x@_bk-e'], 1, '', 'cannot send boxhost/data/x@_bk-e: out of space'));
  const r = await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: e.id }, steps, 2);
  mock.heal();
  t.ok(r.error);
  const failed = await volumesRepo.backupById(db, e.id);
  t.equal(failed?.status, 'failed');
  t.notMatch(failed?.error ?? '', /\/usr\/sbin|boxhost\/data/, 'no host path or dataset in the error');
  t.match(failed?.error ?? '', /out of space/);
  t.notOk(fs.existsSync(backupFiles(backupDir, v.id, 'e').stream));
  t.notOk(await mock.hasBackupSnapshot(v.id, 'e'));
});

t.test('restore: the chain back to its full backup; corrupt, missing or unfinished refused untouched; a running box refused', async (t) => {
  const { mock, steps } = fresh();
  const v = await volume(mock, steps);
  v.set('one');
  const a = await backup(v.id, 'a');
  await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: a.id }, steps);
  v.set('two');
  const b = await backup(v.id, 'b');
  await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: b.id }, steps);
  v.set('three');

  t.same(await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id }, steps), { attempts: 1 });
  t.equal(v.get(), 'two');
  t.same(await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: a.id }, steps), { attempts: 1 });
  t.equal(v.get(), 'one');

  v.set('four');
  fs.appendFileSync(backupFiles(backupDir, v.id, 'a').stream, 'x');
  const corrupt = await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id }, steps);
  t.equal(corrupt.attempts, 1, 'refused at once, not retried');
  t.match(corrupt.error?.message, /backup a is corrupt/, 'the chain is checked: b needs a');
  t.equal(v.get(), 'four', 'the volume was not touched');
  fs.rmSync(backupFiles(backupDir, v.id, 'a').stream);
  t.match((await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: a.id }, steps)).error?.message, /missing/);
  const pending = await backup(v.id, 'p');
  t.match((await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: pending.id }, steps)).error?.message, /only a completed backup restores/);

  // A box that runs with the volume attached: refused.
  const at = now();
  await boxesRepo.insert(db, {
    id: 'bunitdata', project: 'pd', name: 'x', status: 'running', error: null, base: null, fork: null, config: { cpus: 1, ram_mb: 64, storage_gb: 1, region: 'local' },
    environment: {}, tags: {}, data_mounts: [{ name: 'unit', path: '/d', read_only: false }], lifecycle: null, pack: null, pack_rev: null, rollback_to: null,
    termination_grace_period_seconds: 10, url_settings: null, node: 'n1', address: null, created_at: at, updated_at: at,
  });
  await volumesRepo.attach(db, { volume_id: v.id, box_id: 'bunitdata', project: 'pd', box: 'x', path: '/d', read_only: false, created_at: at });
  mock.volumes.get(v.id)!.snapshots.push({ name: 's', createdAt: at, data: 'snap' });
  const busy = await runLikeWorker(restoreDataJob, { volumeId: v.id, snapshot: 's' }, steps);
  t.match(busy.error?.message, /attached to box pd\/x, which is running/);
  t.equal(v.get(), 'four');
});

t.test('generated backup names obey the backup name rule', async (t) => {
  const rule = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
  for (let i = 0; i < 200; i++) {
    const g = generatedBackupName(new Date(Date.UTC(2026, 0, 1) + i * 7_777_777));
    t.ok(rule.test(g) && !g.includes('--'), g);
  }
  t.end();
});

t.test('reconciliation: volumes and backups whose operation was lost come back to a usable state; orphan datasets go', async (t) => {
  const { mock, steps } = fresh();
  const ctx = { config: { nodeId: 'n1', backupDir }, db, log, volumes: mock } as unknown as WorkerContext;
  const made = await volume(mock, steps);
  const at = now();
  const row = (id: string, state: 'creating' | 'restoring' | 'deleting') =>
    volumesRepo.insert(db, { id, name: `rec-${id}`, project: null, node: 'n1', state, quota_gb: 1, description: null, size_bytes: 0, created_by: null, created_at: at, updated_at: at });
  await row('vreccreating', 'creating');
  await mock.createVolume('vreccreating', 1);
  await row('vrecrestoring', 'restoring');
  await mock.createVolume('vrecrestoring', 1);
  await row('vrecdeleting', 'deleting');
  await mock.createVolume('vrecdeleting', 1);
  await mock.createVolume('vrecorphan', 1);
  const stuck = await backup(made.id, 'stuck');
  await volumesRepo.updateBackup(db, stuck.id, { status: 'running', mode: 'full' });
  await mock.holdForBackup(made.id, 'stuck');
  const report = await reconcileVolumes(ctx);
  t.same(report.repairedVolumes.sort(), ['vreccreating', 'vrecdeleting', 'vrecrestoring']);
  t.same(report.orphanVolumes, ['vrecorphan']);
  t.ok(report.failedBackups.includes(stuck.id), 'the stuck backup failed');
  t.equal(await volumesRepo.byId(db, 'vreccreating'), undefined, 'a create that never ended is gone');
  t.notOk(mock.volumes.has('vreccreating'));
  t.equal((await volumesRepo.byId(db, 'vrecrestoring'))?.state, 'ready');
  t.equal((await volumesRepo.byId(db, 'vrecdeleting'))?.state, 'ready', 'a delete can be asked again');
  t.notOk(mock.volumes.has('vrecorphan'));
  t.match(await volumesRepo.backupById(db, stuck.id), { status: 'failed', error: /interrupted/ });
  t.notOk(await mock.hasBackupSnapshot(made.id, 'stuck'));
  // A volume with an unfinished operation is left to it.
  await row('vrecbusy', 'creating');
  await db('operations').insert({ id: newId('op'), kind: 'data.create', status: 'queued', resource: '/v1/data/rec-busy', box_id: 'data:vrecbusy', project: null, node: 'n1', progress: null, error: null, payload: '{}', created_by: null, created_at: at, updated_at: at });
  await reconcileVolumes(ctx);
  t.equal((await volumesRepo.byId(db, 'vrecbusy'))?.state, 'creating');
});

t.test('a restore of a backup on another node moves the volume there; the old node lets go of its dataset', async (t) => {
  const one = fresh('n1');
  const two = fresh('n2');
  const v = await volume(one.mock, one.steps);
  v.set('moved-data');
  const b = await backup(v.id, 'mv');
  t.same(await runLikeWorker(backupDataJob, { volumeId: v.id, backupId: b.id }, one.steps), { attempts: 1 });
  const sweepOf = (x: ReturnType<typeof fresh>, nodeId: string) => () => sweepEvictions({ db, volumes: x.mock, config: { nodeId } } as unknown as WorkerContext);

  const wrong = await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id, node: 'n2' }, one.steps);
  t.match(wrong.error?.message, /ran on node n1/, 'a move runs only on the node it was sent to');
  t.equal((await volumesRepo.byId(db, v.id))?.node, 'n1');
  t.equal(one.mock.volumes.get(v.id)?.data, 'moved-data', "and n1's volume is untouched by its clean-up");
  t.same(await volumesRepo.evictionsOf(db, 'n1'), [], 'nor marked to go');

  // The receive succeeds, the last step fails for good: n2's copy is to go, the volume stays on n1.
  two.mock.failAlways('info', new Error('zfs get exited 1'));
  const failed = await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id, node: 'n2' }, two.steps, 2);
  t.ok(failed.error, 'the move failed');
  t.match(await volumesRepo.byId(db, v.id), { node: 'n1', state: 'ready' });
  t.same((await volumesRepo.evictionsOf(db, 'n2')).map((e) => [e.volume_id, e.node]), [[v.id, 'n2']], 'n2 is to let go of what it received');
  t.same(await sweepOf(two, 'n2')(), [v.id], "n2 let go of the failed move's dataset");
  t.notOk(two.mock.volumes.has(v.id));
  t.ok(one.mock.volumes.has(v.id), "n1's is untouched");
  two.mock.heal();

  const op = newId('op');
  t.same(await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id, node: 'n2' }, two.steps), { attempts: 1 });
  t.match(await volumesRepo.byId(db, v.id), { node: 'n2', state: 'ready' }, 'n2 holds the volume');
  t.equal(two.mock.volumes.get(v.id)?.data, 'moved-data', "with the backup's data");
  t.same((await volumesRepo.evictionsOf(db, 'n1')).map((e) => e.volume_id), [v.id], 'n1 is to let go of its dataset');
  t.same(await volumesRepo.evictionsOf(db, 'n2'), [], 'n2 has nothing to let go of');

  // A move back to n1 under way when n1 looks: its dataset stays, the row too.
  await db('operations').insert({ id: op, kind: 'data.restore', status: 'running', resource: '/v1/data/x', box_id: `data:${v.id}`, project: null, node: 'n1', progress: null, error: null, payload: '{}', created_by: null, created_at: now(), updated_at: now() });
  t.same(await sweepOf(one, 'n1')(), [], 'not while an operation of the volume is under way');
  t.ok(one.mock.volumes.has(v.id));
  await db('operations').where({ id: op }).update({ status: 'succeeded' });
  t.same(await sweepOf(one, 'n1')(), [v.id], 'then it goes');
  t.notOk(one.mock.volumes.has(v.id));
  t.same(await volumesRepo.evictionsOf(db, 'n1'), [], 'and the row with it');
  t.equal(two.mock.volumes.get(v.id)?.data, 'moved-data', "n2's copy is the volume");
  t.ok(fs.existsSync(backupFiles(backupDir, v.id, 'mv').stream), 'the backups stay');

  // Moved back to n1 before n2 looked: n2's dataset goes, n1's (the volume) never.
  t.same(await runLikeWorker(restoreDataJob, { volumeId: v.id, backupId: b.id, node: 'n1' }, one.steps), { attempts: 1 });
  t.match(await volumesRepo.byId(db, v.id), { node: 'n1' });
  await volumesRepo.evict(db, v.id, 'n1');
  t.same(await sweepOf(one, 'n1')(), [], 'a node never destroys a volume it holds');
  t.ok(one.mock.volumes.has(v.id));
  t.same(await volumesRepo.evictionsOf(db, 'n1'), [], 'the stale row is forgotten');
  t.same(await sweepOf(two, 'n2')(), [v.id]);
  t.notOk(two.mock.volumes.has(v.id));
});
