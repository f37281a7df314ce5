/**
 * ZfsStorage against the real ZFS of the build machine (zfs-fuse here): its own data dir and
 * host tag, so its pool `boxhost-<tag>` never meets another test's, and the pool goes at the end.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { run } from '../core/command';
import type { BaseRef } from '../workers/drivers';
import { StorageInUseError, ZfsStorage } from '../workers/storage/zfs';

const hostTag = `zt${crypto.randomBytes(3).toString('hex')}`;
const dataDir = fs.mkdtempSync(path.join(fs.existsSync('/var/tmp') ? '/var/tmp' : os.tmpdir(), `boxhost-zfs-${hostTag}-`));
const pool = `boxhost-${hostTag}`;
const messages: string[] = [];
const logger = { debug: () => undefined, info: (...a: any[]) => messages.push(JSON.stringify(a)), warn: (...a: any[]) => messages.push(JSON.stringify(a)) };
const storage = new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, logger });

const base: BaseRef = { name: 'tiny', version: 'v1' };
const otherBase: BaseRef = { name: 'tiny', version: 'v2' };

const zfsValue = async (name: string, prop: string) =>
  (await run(['zfs', 'get', '-Hp', '-o', 'value', prop, name])).stdout.trim();
const datasets = async (type = 'filesystem') =>
  (await run(['zfs', 'list', '-H', '-o', 'name', '-t', type, '-r', pool])).stdout.split('\n').filter(Boolean);
const read = (dir: string, file: string) => fs.readFileSync(path.join(dir, file), 'utf8');

async function timed<T>(label: string, fn: () => Promise<T>): Promise<T> {
  const start = process.hrtime.bigint();
  const out = await fn();
  t.comment(`${label}: ${(Number(process.hrtime.bigint() - start) / 1e6).toFixed(1)} ms`);
  return out;
}

t.teardown(async () => {
  await storage.destroyPool().catch((e) => console.error('destroyPool failed:', e));
  fs.rmSync(dataDir, { recursive: true, force: true });
});

t.test('init makes the pool on a file and the layout, and is idempotent', async (t) => {
  await timed('init (new pool)', () => storage.init());
  t.ok(fs.existsSync(path.join(dataDir, 'zfs', 'pool.img')), 'pool image in the data dir');
  t.equal((await run(['zpool', 'list', '-H', '-o', 'health', pool])).stdout.trim(), 'ONLINE');
  t.equal(await zfsValue(pool, 'mountpoint'), path.join(dataDir, 'zfs', 'mnt'));
  for (const child of ['bases', 'boxes', 'data']) t.ok((await datasets()).includes(`${pool}/${child}`), `${child} dataset`);
  await storage.health();

  await storage.init();
  const again = new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, logger });
  await again.init();
  await again.health();
  t.equal((await run(['zpool', 'list', '-H', '-o', 'name'])).stdout.split('\n').filter((n) => n === pool).length, 1, 'one pool');
  t.equal(again.boxRootPath('bx'), storage.boxRootPath('bx'));
});

t.test('an exported pool is imported again from the data dir', async (t) => {
  await run(['zpool', 'export', pool]);
  await t.rejects(storage.health(), /not imported/);
  const after = new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, logger });
  await timed('init (import)', () => after.init());
  await storage.health();
  t.ok((await datasets()).includes(`${pool}/boxes`));
});

t.test('bases', async (t) => {
  t.equal(await storage.hasBase(base), false);
  let fills = 0;
  const fill = async (dir: string) => {
    fills++;
    fs.mkdirSync(path.join(dir, 'etc'));
    fs.writeFileSync(path.join(dir, 'etc', 'hostname'), 'tiny\n');
    fs.writeFileSync(path.join(dir, 'big'), crypto.randomBytes(1 << 20));
  };
  await timed('createBase (1 MiB)', () => storage.createBase(base, fill));
  t.equal(await storage.hasBase(base), true);
  t.equal(fills, 1);
  await storage.createBase(base, fill);
  t.equal(fills, 1, 'second createBase keeps the made base');
  t.equal(read(storage.basePath(base), 'etc/hostname'), 'tiny\n');
  t.ok((await storage.baseSizeBytes(base)) >= 1 << 20, 'base size counts its files');
  // zfs-fuse answers readonly "off (temporary)" even while it is in force: try a write instead.
  t.throws(() => fs.writeFileSync(path.join(storage.basePath(base), 'x'), 'x'), { code: 'EROFS' }, 'base is read-only');

  // Half-made: a dataset without @base (a crash during fill) is made again.
  await run(['zfs', 'create', '-p', `${pool}/bases/tiny/v2`]);
  fs.writeFileSync(path.join(storage.basePath(otherBase), 'junk'), 'x');
  t.equal(await storage.hasBase(otherBase), false);
  await storage.createBase(otherBase, async (dir) => fs.writeFileSync(path.join(dir, 'v2'), 'two'));
  t.equal(await storage.hasBase(otherBase), true);
  t.notOk(fs.existsSync(path.join(storage.basePath(otherBase), 'junk')), 'half-made content gone');

  // Two makers of one base at once: one fills it, the other finds it made.
  const twin: BaseRef = { name: 'twin', version: 'v1' };
  let twinFills = 0;
  await Promise.all([1, 2].map(() => storage.createBase(twin, async (dir) => {
    twinFills++;
    fs.writeFileSync(path.join(dir, 'twin'), 'twin');
  })));
  t.equal(twinFills, 1);
  t.equal(read(storage.basePath(twin), 'twin'), 'twin');
  await storage.destroyBase(twin);
  t.notOk((await datasets()).includes(`${pool}/bases/twin`));

  // A failing fill leaves nothing behind.
  const broken: BaseRef = { name: 'broken', version: 'v1' };
  await t.rejects(storage.createBase(broken, async () => { throw new Error('fill broke'); }), /fill broke/);
  t.equal(await storage.hasBase(broken), false);
  t.notOk((await datasets()).includes(`${pool}/bases/broken/v1`));
});

t.test('box roots from a base, quota, forks, snapshots', async (t) => {
  const a = 'bzfsaaaa';
  const dir = await timed('createBoxRoot from base', () => storage.createBoxRoot(a, { kind: 'base', base }, 1));
  t.equal(dir, storage.boxRootPath(a));
  t.equal(read(dir, 'etc/hostname'), 'tiny\n', 'box root sees the base files');
  t.equal(await zfsValue(`${pool}/boxes/${a}`, 'refquota'), String(1024 ** 3), 'refquota = storage_gb');
  t.equal(await storage.createBoxRoot(a, { kind: 'base', base }, 1), dir, 'idempotent');
  t.equal(await storage.hasBoxRoot(a), true);
  t.equal(await storage.hasBoxRoot('bnothere'), false);

  fs.writeFileSync(path.join(dir, 'before'), 'before snapshot');
  await timed('snapshotBoxRoot', () => storage.snapshotBoxRoot(a, 's1'));
  await storage.snapshotBoxRoot(a, 's1');
  fs.writeFileSync(path.join(dir, 'after'), 'after snapshot');

  // Fork as it is now.
  const b = 'bzfsbbbb';
  const bDir = await timed('createBoxRoot fork (snapshot + clone)', () => storage.createBoxRoot(b, { kind: 'box', boxId: a }, 2));
  t.equal(read(bDir, 'before'), 'before snapshot');
  t.equal(read(bDir, 'after'), 'after snapshot', 'fork carries files written to the source');
  t.equal(await zfsValue(`${pool}/boxes/${b}`, 'refquota'), String(2 * 1024 ** 3));
  t.equal(await storage.createBoxRoot(b, { kind: 'box', boxId: a }), bDir, 'fork is idempotent');
  fs.writeFileSync(path.join(bDir, 'own'), 'b only');
  t.notOk(fs.existsSync(path.join(dir, 'own')), 'fork writes stay in the fork');

  // Fork from a named snapshot.
  const c = 'bzfscccc';
  const cDir = await storage.createBoxRoot(c, { kind: 'box', boxId: a, snapshot: 's1' });
  t.equal(read(cDir, 'before'), 'before snapshot');
  t.notOk(fs.existsSync(path.join(cDir, 'after')), 'snapshot fork has the state at the snapshot');
  t.equal(await zfsValue(`${pool}/boxes/${c}`, 'refquota'), '0', 'no quota when none asked');

  await t.rejects(storage.createBoxRoot('bzfsdddd', { kind: 'box', boxId: a, snapshot: 'nope' }), /no snapshot nope/);
  await t.rejects(storage.createBoxRoot('bzfsdddd', { kind: 'box', boxId: 'bmissing' }), /does not exist/);
  await t.rejects(storage.createBoxRoot('bzfsdddd', { kind: 'base', base: { name: 'nobase', version: 'v0' } }), /does not exist/);
  t.equal(await storage.hasBoxRoot('bzfsdddd'), false);
  await t.rejects(storage.snapshotBoxRoot('bmissing', 'x'), /box root bmissing does not exist/);
  await t.rejects(storage.listBoxSnapshots('bmissing'), /box root bmissing does not exist/);
  await t.rejects(storage.snapshotBoxRoot(a, '_internal'), /invalid snapshot name/);
  t.throws(() => storage.boxRootPath('../etc'), /invalid box id/);

  t.same((await storage.listBoxRoots()).sort(), [a, b, c].sort());

  const snaps = await storage.listBoxSnapshots(a);
  t.same(snaps.map((s) => s.name), ['s1'], 'internal fork snapshots are not listed');
  t.match(snaps[0].createdAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  t.ok(Math.abs(Date.parse(snaps[0].createdAt) - Date.now()) < 120_000, 'creation time is now-ish');
  t.type(snaps[0].sizeBytes, 'number');
  t.same(await storage.listBoxSnapshots(b), []);

  // A base with box roots cannot go.
  await t.rejects(storage.destroyBase(base), { name: 'StorageInUseError', code: 'conflict', dependents: [a, b, c] }, 'forks of its boxes count too');
  t.ok(await storage.destroyBase(base).catch((e) => e instanceof StorageInUseError));
  t.equal(await storage.hasBase(base), true);

  // Destroying the source of live forks keeps the forks whole.
  await timed('destroyBoxRoot with forks (promote + destroy)', () => storage.destroyBoxRoot(a));
  t.equal(await storage.hasBoxRoot(a), false, 'source gone');
  t.notOk(fs.existsSync(storage.boxRootPath(a)), 'source mountpoint gone');
  t.equal(read(bDir, 'after'), 'after snapshot', 'fork b keeps its files');
  t.equal(read(bDir, 'own'), 'b only');
  t.equal(read(bDir, 'etc/hostname'), 'tiny\n');
  t.equal(read(cDir, 'before'), 'before snapshot', 'fork c keeps its files');
  t.notOk(fs.existsSync(path.join(cDir, 'after')));
  t.same(await storage.listBoxSnapshots(b), [], 'promoted fork lists none of the source snapshots');
  t.same(await storage.listBoxSnapshots(c), []);
  await storage.destroyBoxRoot(a);
  t.same((await storage.listBoxRoots()).sort(), [b, c].sort());
  await t.rejects(storage.destroyBase(base), /in use by 2 box root/, 'promoted forks still count against the base');

  // Deleting a snapshot that a fork was made from: the name goes, the fork stays.
  await storage.snapshotBoxRoot(b, 'keep');
  await storage.snapshotBoxRoot(b, 'mid');
  fs.writeFileSync(path.join(bDir, 'late'), 'late');
  const e = 'bzfseeee';
  const eDir = await storage.createBoxRoot(e, { kind: 'box', boxId: b, snapshot: 'mid' });
  await storage.destroyBoxSnapshot(b, 'mid');
  await storage.destroyBoxSnapshot(b, 'mid');
  t.same((await storage.listBoxSnapshots(b)).map((s) => s.name), ['keep']);
  t.equal(read(eDir, 'own'), 'b only');
  t.notOk(fs.existsSync(path.join(eDir, 'late')));
  await storage.snapshotBoxRoot(b, 'mid');
  t.same((await storage.listBoxSnapshots(b)).map((s) => s.name), ['keep', 'mid'], 'the name is free again');
  await storage.destroyBoxSnapshot(b, 'mid');
  t.same((await storage.listBoxSnapshots(b)).map((s) => s.name), ['keep']);

  // e's own snapshot named like one of b's must survive b's destruction (promote name clash).
  await storage.snapshotBoxRoot(e, 'keep');
  await storage.destroyBoxRoot(b);
  t.equal(await storage.hasBoxRoot(b), false);
  t.equal(read(eDir, 'own'), 'b only', 'fork of a fork survives');
  t.same((await storage.listBoxSnapshots(e)).map((s) => s.name), ['keep']);

  await timed('destroyBoxRoot (no forks)', () => storage.destroyBoxRoot(e));
  await storage.destroyBoxRoot(c);
  await storage.destroyBoxRoot(c);
  t.same(await storage.listBoxRoots(), []);
  t.same(await datasets('snapshot'), [`${pool}/bases/tiny/v1@base`, `${pool}/bases/tiny/v2@base`], 'no internal snapshot leaks');

  await storage.destroyBase(base);
  await storage.destroyBase(base);
  t.equal(await storage.hasBase(base), false);
  t.ok((await datasets()).includes(`${pool}/bases/tiny`), 'name dataset stays while v2 exists');
  await storage.destroyBase(otherBase);
  t.notOk((await datasets()).includes(`${pool}/bases/tiny`), 'name dataset goes with its last version');
});

t.test('a fork whose clone never happened leaves no snapshot behind', async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const src = 'bzfsffff';
  await storage.createBoxRoot(src, { kind: 'base', base });
  // As a crash between snapshot and clone would leave it.
  await run(['zfs', 'snapshot', `${pool}/boxes/${src}@_fork-bzfsgggg`]);
  await storage.destroyBoxRoot('bzfsgggg');
  t.same(await datasets('snapshot'), [`${pool}/bases/tiny/v1@base`]);
  await storage.destroyBoxRoot(src);
  await storage.destroyBase(base);
});

t.test('concurrent retries of the same create agree', async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const paths = await Promise.all([1, 2, 3].map(() => storage.createBoxRoot('bzfsconc', { kind: 'base', base }, 1)));
  t.same(new Set(paths).size, 1);
  const forks = await Promise.all([1, 2, 3].map(() => storage.createBoxRoot('bzfsconcf', { kind: 'box', boxId: 'bzfsconc' })));
  t.same(new Set(forks).size, 1);
  t.equal(read(forks[0], 'f'), 'f');
  // Two racing destroys of a fork's source once promoted the fork over its base (and took @base).
  await Promise.all([storage.destroyBoxRoot('bzfsconc'), storage.destroyBoxRoot('bzfsconc')]);
  t.equal(await storage.hasBoxRoot('bzfsconc'), false);
  t.equal(read(forks[0], 'f'), 'f');
  t.equal(await zfsValue(`${pool}/boxes/bzfsconcf`, 'origin'), `${pool}/bases/tiny/v1@base`, 'fork now hangs off the base');
  await storage.destroyBoxRoot('bzfsconcf');
  t.same(await storage.listBoxRoots(), []);
  t.same(await datasets('snapshot'), [`${pool}/bases/tiny/v1@base`]);
  await storage.destroyBase(base);
});

t.test('timings', async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), crypto.randomBytes(2 << 20)));
  const ms = async (fn: () => Promise<unknown>) => {
    const s = process.hrtime.bigint();
    await fn();
    return Number(process.hrtime.bigint() - s) / 1e6;
  };
  const median = (xs: number[]) => xs.sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  const clone: number[] = [];
  const snap: number[] = [];
  const fork: number[] = [];
  const destroy: number[] = [];
  for (let i = 0; i < 7; i++) {
    const id = `bzfst${i}`;
    clone.push(await ms(() => storage.createBoxRoot(id, { kind: 'base', base }, 1)));
    fs.writeFileSync(path.join(storage.boxRootPath(id), 'w'), crypto.randomBytes(1 << 20));
    snap.push(await ms(() => storage.snapshotBoxRoot(id, 'one')));
    fork.push(await ms(() => storage.createBoxRoot(`${id}f`, { kind: 'box', boxId: id })));
    destroy.push(await ms(() => storage.destroyBoxRoot(`${id}f`)));
    destroy.push(await ms(() => storage.destroyBoxRoot(id)));
  }
  t.comment(`median ms: createBoxRoot ${median(clone).toFixed(1)}, snapshotBoxRoot ${median(snap).toFixed(1)}, fork ${median(fork).toFixed(1)}, destroyBoxRoot ${median(destroy).toFixed(1)}`);
  t.same(await storage.listBoxRoots(), []);
  await storage.destroyBase(base);
});

t.test('destroyPool removes the pool and its image', async (t) => {
  await storage.destroyPool();
  t.notOk((await run(['zpool', 'list', '-H', '-o', 'name'])).stdout.split('\n').includes(pool));
  t.notOk(fs.existsSync(path.join(dataDir, 'zfs', 'pool.img')));
  t.notOk(fs.existsSync(path.join(dataDir, 'zfs')));
  await storage.destroyPool();
  await t.rejects(new ZfsStorage({ dataDir, pool: 'tank/x', poolSizeGb: 1, hostTag }).destroyPool(), /refusing/);
});
