/**
 * ZfsStorage against the real ZFS of the build machine (zfs-fuse here): its own data dir and
 * host tag, so its pool `boxhost-<tag>` never meets another test's, and the pool goes at the end.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { HostPaths } from '../workers/runtime/reach';
import { run } from '../core/command';
import { machineMountLock } from '../workers/storage/zfsFuse';

/** What the driver's commands that mount hold on zfs-fuse (workers/storage/zfsCommon.ts). */
const ZFS_FUSE_MOUNT_LOCK = machineMountLock();
import { projectIdMap } from '../core/box';
import { shiftTree } from '../workers/bases/idShift';
import type { BaseRef } from '../workers/drivers';
import { StorageInUseError, ZfsStorage } from '../workers/storage/zfs';
import { HOST_ONLY } from '../workers/storage/zfsPool';
import { ROOTS_PER_ARC_MB, ZFS_FUSE_MAX_MOUNTS, ZfsFuseDaemon, zfsFuseMounts } from '../workers/storage/zfsFuse';
import { claimDir } from './helpers/owner';

const hostTag = `zt${crypto.randomBytes(3).toString('hex')}`;
const dataDir = claimDir(fs.mkdtempSync(path.join(fs.existsSync('/var/tmp') ? '/var/tmp' : os.tmpdir(), `boxhost-zfs-${hostTag}-`)));
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
/** The per-mount options of the mount at `dir` (/proc/self/mountinfo field 6). */
const mountOptions = (dir: string) =>
  fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')).filter((f) => f[4] === dir).map((f) => f[5]).pop() ?? '';
const owner = (p: string) => {
  const st = fs.lstatSync(p);
  return [st.uid, st.gid];
};

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
  // Volumes, bases, shifted bases and temporary clones: no range walks through their directories
  // (docs/security.md), and a start sets that right whatever changed it.
  const mnt = path.join(dataDir, 'zfs', 'mnt');
  fs.chmodSync(path.join(mnt, 'data'), 0o755);
  fs.chownSync(path.join(mnt, 'bases'), 0, 1000000);
  await again.init();
  for (const child of HOST_ONLY) {
    const st = fs.lstatSync(path.join(mnt, child));
    t.same([st.uid, st.gid, st.mode & 0o7777], [0, 0, 0o700], `${child}: root:root 0700`);
  }
  const boxes = fs.lstatSync(path.join(mnt, 'boxes'));
  t.equal(boxes.mode & 0o7777, 0o755, "the boxes' directory of links stays open");
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
  t.equal(read(storage.baseRootPath(base), 'etc/hostname'), 'tiny\n');
  t.ok((await storage.baseSizeBytes(base)) >= 1 << 20, 'base size counts its files');
  // zfs-fuse answers readonly "off (temporary)" even while it is in force: try a write instead.
  t.throws(() => fs.writeFileSync(path.join(storage.baseRootPath(base), 'x'), 'x'), { code: 'EROFS' }, 'base is read-only');

  // Half-made: a dataset without @base (a crash during fill) is made again.
  await run(['zfs', 'create', '-p', `${pool}/bases/tiny/v2`], { lockFile: ZFS_FUSE_MOUNT_LOCK });
  fs.writeFileSync(path.join(storage.baseRootPath(otherBase), 'junk'), 'x');
  t.equal(await storage.hasBase(otherBase), false);
  await storage.createBase(otherBase, async (dir) => fs.writeFileSync(path.join(dir, 'v2'), 'two'));
  t.equal(await storage.hasBase(otherBase), true);
  t.notOk(fs.existsSync(path.join(storage.baseRootPath(otherBase), 'junk')), 'half-made content gone');

  // Two makers of one base at once: one fills it, the other finds it made.
  const twin: BaseRef = { name: 'twin', version: 'v1' };
  let twinFills = 0;
  await Promise.all([1, 2].map(() => storage.createBase(twin, async (dir) => {
    twinFills++;
    fs.writeFileSync(path.join(dir, 'twin'), 'twin');
  })));
  t.equal(twinFills, 1);
  t.equal(read(storage.baseRootPath(twin), 'twin'), 'twin');
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
  t.equal(await zfsValue(`${pool}/boxes/${a}`, 'quota'), String(1024 ** 3), 'quota = storage_gb: snapshots and forks count');
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
  for (const id of [a, b, c]) {
    t.same([await zfsValue(`${pool}/boxes/${id}`, 'setuid'), await zfsValue(`${pool}/boxes/${id}`, 'devices')], ['off', 'off'], `${id}: setuid and devices off`);
  }

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

t.test('rootLimit: what zfs-fuse can still mount, box roots of this pool not counted against it', async (t) => {
  if (!storage.restartable) {
    t.equal(await storage.rootLimit(), null, 'kernel ZFS: no limit');
    return;
  }
  const others = () => zfsFuseMounts().filter((m) => !m.startsWith(`${pool}/boxes/`)).length;
  // Other test files' pools mount and unmount beside this one: the limit is read while the
  // machine's other mounts hold still around the call.
  const steady = async () => {
    for (let i = 0; ; i++) {
      const o = others();
      const limit = await storage.rootLimit();
      if (others() === o || i >= 50) return { limit, others: o };
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const held = Math.min(ZFS_FUSE_MAX_MOUNTS, Math.floor(new ZfsFuseDaemon({ info() {}, warn() {} }).runningArcMb() * ROOTS_PER_ARC_MB));
  const before = await steady();
  t.equal(before.limit, held - before.others - 16, 'the limit (mounts, or what the ARC holds) less every other mount and the reserve');
  t.ok(zfsFuseMounts().includes(`${pool}/bases`), 'this pool\'s own datasets are seen as mounts');
  const id = 'bzfsroots';
  await storage.createBoxRoot(id, { kind: 'base', base }, 1);
  t.ok(zfsFuseMounts().includes(`${pool}/boxes/${id}`), 'the new root is mounted');
  const after = await steady();
  t.equal(after.limit, held - after.others - 16, 'a root of its own does not lower it (admission counts box rows)');
  await storage.destroyBoxRoot(id);
  await storage.destroyBase(base);
  t.notOk(zfsFuseMounts().includes(`${pool}/boxes/${id}`));
  t.same(
    zfsFuseMounts('1 2 0:1 / /a rw - fuse.zfs tank/boxes/x rw\n2 1 0:2 / /b rw - fuse kstat rw\n3 1 0:3 / /c rw shared:1 - ext4 /dev/vda rw\n'),
    ['tank/boxes/x'],
    'mountinfo: only fuse.zfs mounts, by source (optional fields before the separator)',
  );
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

t.test('creates of one root racing, from one driver and from separate ones (as from two processes), agree', async (t) => {
  // Before the fix, 4 at once from one driver failed 12 rounds of 40 in a stress script run
  // alone ("cannot mount …: directory is not empty", "failed to create mountpoint", "busy"), and
  // the test below failed once in CI with 3. Here, after the tests above, it rarely shows: this
  // keeps the behaviour asserted rather than proving the race each run.
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const drivers = [storage, storage, storage, storage, ...[1, 2, 3].map(() => new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, logger }))];
  for (let i = 0; i < 10; i++) {
    // A new name each round, as each box has: its mount point is made by the race too.
    const id = `bzfsrace${i}`;
    const got = await Promise.allSettled(drivers.map((d) => d.createBoxRoot(id, { kind: 'base', base }, 1)));
    const failed = got.filter((g): g is PromiseRejectedResult => g.status === 'rejected').map((g) => String(g.reason?.message ?? g.reason));
    t.same(failed, [], `round ${i}: every attempt made or found the root`);
    t.equal(read(storage.boxRootPath(id), 'f'), 'f', `round ${i}: mounted, with the base's files`);
    await storage.destroyBoxRoot(id);
  }
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

t.test('a source and its forks deleted at once, from one driver and from two (as from two processes), leave nothing', async (t) => {
  // Unlocked, each delete promoted and destroyed the other's snapshots: a source and its fork
  // deleted at once left one of the two roots (the delete answered done) and failed the other,
  // 20 rounds of 20 in a stress script; the soak met it in CI (a root left after round 2).
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const other = new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, logger });
  const idMap = projectIdMap(5);
  for (let i = 0; i < 6; i++) {
    const [a, b, c, d] = ['a', 'b', 'c', 'd'].map((x) => `bfam${x}${i}`);
    await storage.createBoxRoot(a, { kind: 'base', base }, 1, idMap);
    await storage.createBoxRoot(b, { kind: 'box', boxId: a }, 1, idMap);
    await storage.createBoxRoot(c, { kind: 'box', boxId: b }, 1, idMap);
    await storage.createBoxRoot(d, { kind: 'box', boxId: a }, 1, idMap);
    const drivers = i % 2 === 0 ? [storage, storage, storage, storage] : [storage, other, storage, other];
    const got = await Promise.allSettled([a, b, c, d].map((id, k) => drivers[k].destroyBoxRoot(id)));
    const failed = got.filter((g): g is PromiseRejectedResult => g.status === 'rejected').map((g) => String(g.reason?.message ?? g.reason));
    t.same(failed, [], `round ${i}: every delete done`);
    t.same(await storage.listBoxRoots(), [], `round ${i}: no root left`);
    t.same((await datasets('snapshot')).filter((n) => n.startsWith(`${pool}/boxes/`)), [], `round ${i}: no snapshot of a root left`);
  }
  await storage.destroyBase(base);
});

t.test('shiftTree: owners move into the range; links, modes and capabilities are kept', async (t) => {
  // On the host's own filesystem: zfs-fuse has no extended attributes (no file capabilities).
  const dir = fs.mkdtempSync(path.join(dataDir, 'shift-'));
  const range = projectIdMap(7);
  fs.mkdirSync(path.join(dir, 'home/box'), { recursive: true });
  fs.chownSync(path.join(dir, 'home/box'), 1000, 1000);
  fs.copyFileSync('/usr/bin/busybox', path.join(dir, 'suid'));
  fs.chownSync(path.join(dir, 'suid'), 0, 5);
  fs.chmodSync(path.join(dir, 'suid'), 0o6755);
  fs.copyFileSync('/usr/bin/busybox', path.join(dir, 'capped'));
  await run(['setcap', 'cap_net_bind_service=ep', path.join(dir, 'capped')]);
  fs.writeFileSync(path.join(dir, 'far'), 'x');
  fs.chownSync(path.join(dir, 'far'), 100_000, 70_000);
  fs.writeFileSync(path.join(dir, 'linked'), 'x');
  fs.linkSync(path.join(dir, 'linked'), path.join(dir, 'home/hardlink'));
  fs.symlinkSync('/etc/passwd', path.join(dir, 'escape'));
  const hostPasswd = owner('/etc/passwd');

  const { entries } = await shiftTree(dir, range);
  t.equal(entries, 8, 'every entry once (the hard link once for its two names)');
  const H = range.hostId;
  t.same(owner(dir), [H, H], 'the top directory too');
  t.same(owner(path.join(dir, 'home/box')), [H + 1000, H + 1000]);
  t.same(owner(path.join(dir, 'suid')), [H, H + 5]);
  t.equal(fs.statSync(path.join(dir, 'suid')).mode & 0o7777, 0o6755, 'setuid and setgid bits put back');
  t.same(owner(path.join(dir, 'linked')), [H, H], 'a hard-linked inode is shifted once');
  t.same(owner(path.join(dir, 'far')), [H + 65534, H + 65534], "ids past the range become the range's nobody");
  t.ok(fs.lstatSync(path.join(dir, 'escape')).isSymbolicLink(), 'a symlink stays a symlink');
  t.same(owner(path.join(dir, 'escape')), [H, H], 'and is shifted itself');
  t.same(owner('/etc/passwd'), hostPasswd, 'its target is untouched');
  const cap = (await run(['python3', '-c', `import os;print(os.getxattr(${JSON.stringify(path.join(dir, 'capped'))},'security.capability').hex())`])).stdout.trim();
  t.equal(cap.slice(0, 8), '01000003', 'the capability is namespaced (v3)');
  t.equal(Buffer.from(cap, 'hex').readUInt32LE(20), H, 'with the range as its root');
  t.match((await run(['getcap', path.join(dir, 'capped')])).stdout, /cap_net_bind_service=ep/);
  fs.rmSync(dir, { recursive: true });
});

t.test('id ranges: base copies shifted once per range, forks stay in theirs, base deletion takes the copies', async (t) => {
  await storage.createBase(base, async (dir) => {
    fs.mkdirSync(path.join(dir, 'home/box'), { recursive: true });
    fs.chownSync(path.join(dir, 'home/box'), 1000, 1000);
    fs.writeFileSync(path.join(dir, 'f'), 'f');
  });
  const p1 = projectIdMap(1);
  const p2 = projectIdMap(2);
  messages.length = 0;
  const r1 = await timed('createBoxRoot, first of its range (shift)', () => storage.createBoxRoot('bidsa', { kind: 'base', base }, 1, p1));
  const r1b = await timed('createBoxRoot, second of its range (one clone)', () => storage.createBoxRoot('bidsb', { kind: 'base', base }, 1, p1));
  const r2 = await storage.createBoxRoot('bidsc', { kind: 'base', base }, 1, p2);
  t.equal(messages.filter((m) => m.includes("made a base's copy in an id range")).length, 2, 'one copy per range');
  t.same(owner(fs.realpathSync(r1)), [p1.hostId, p1.hostId], 'root of range 1');
  t.same(owner(path.join(r1b, 'home/box')), [p1.hostId + 1000, p1.hostId + 1000]);
  t.same(owner(path.join(r2, 'f')), [p2.hostId, p2.hostId], 'another range, another owner');
  t.same(owner(path.join(storage.baseRootPath(base), 'f')), [0, 0], 'the base itself is untouched');
  t.equal(await zfsValue(`${pool}/boxes/bidsa`, 'boxhost:idmap'), String(p1.hostId));
  t.equal(await zfsValue(`${pool}/boxes/bidsa`, 'origin'), `${pool}/shifted/tiny/v1/${p1.hostId}@base`);

  for (const id of ['bidsa', 'bidsc']) {
    await storage.prepareBoxRoot(id, id === 'bidsa' ? p1 : p2);
    t.match(mountOptions(fs.realpathSync(storage.boxRootPath(id))), /\bnosuid\b.*\bnodev\b|\bnodev\b.*\bnosuid\b/, `${id}: mounted nosuid,nodev once ready to start`);
  }
  // A create's start takes its fresh root as the clone left it (nosuid,nodev, where it is
  // mounted), unless the storage daemon is another one than before the clone: a restart mounts
  // every dataset anew.
  const kit = (storage as any).datasets;
  const privately = kit.mountPrivately.bind(kit);
  let remounts = 0;
  kit.mountPrivately = (dir: string) => {
    remounts++;
    return privately(dir);
  };
  const realB = fs.realpathSync(storage.boxRootPath('bidsb'));
  t.match(mountOptions(realB), /\bnosuid\b.*\bnodev\b|\bnodev\b.*\bnosuid\b/, 'a root is mounted nosuid,nodev as soon as it is made');
  remounts = 0;
  t.equal(await storage.prepareBoxRoot('bidsb', p1), realB, "a fresh root's first start: its real mount is the answer");
  t.equal(remounts, 0, 'the same daemon: its mount is not looked at again');
  // A daemon restarted while the clone ran (its pid read before the clone, and again at the start).
  const realZfs = kit.zfs.bind(kit);
  let restarted = false;
  kit.daemonPid = () => (restarted ? 4194304 : 4194303);
  kit.zfs = async (args: string[], allowFailure?: boolean) => {
    const r = await realZfs(args, allowFailure);
    if (args[0] === 'clone') restarted = true;
    return r;
  };
  try {
    await storage.createBoxRoot('bidse', { kind: 'base', base }, 1, p1);
    const realE = fs.realpathSync(storage.boxRootPath('bidse'));
    await run(['mount', '-o', 'remount,bind,suid,dev', realE]); // as the new daemon's mount would be
    t.notMatch(mountOptions(realE), /\bnosuid\b/, 'control: remounted without nosuid');
    remounts = 0;
    t.equal(await storage.prepareBoxRoot('bidse', p1), realE, 'ready: its real mount is the answer');
    t.equal(remounts, 1, 'the daemon changed after the clone began: the mount is looked at again');
    t.match(mountOptions(realE), /\bnosuid\b.*\bnodev\b|\bnodev\b.*\bnosuid\b/, 'and made nosuid,nodev again');
  } finally {
    delete kit.daemonPid;
    delete kit.zfs;
    delete kit.mountPrivately;
  }
  await storage.destroyBoxRoot('bidse');
  const fork = await storage.createBoxRoot('bidsf', { kind: 'box', boxId: 'bidsa' }, 1, p1);
  t.same(owner(path.join(fork, 'f')), [p1.hostId, p1.hostId], 'a fork is in its source range as cloned');
  t.equal(await zfsValue(`${pool}/boxes/bidsf`, 'boxhost:idmap'), String(p1.hostId));
  t.ok(await storage.prepareBoxRoot('bidsf', p1).then(() => true), 'ready at once');
  await t.rejects(storage.prepareBoxRoot('bidsf', p2), /id range/, 'a root is never moved to another range');

  await t.rejects(storage.destroyBase(base), { name: 'StorageInUseError', dependents: ['bidsa', 'bidsb', 'bidsc', 'bidsf'] }, 'roots of the copies count');
  for (const id of ['bidsa', 'bidsb', 'bidsc', 'bidsf']) await storage.destroyBoxRoot(id);
  t.ok((await datasets()).some((d) => d.startsWith(`${pool}/shifted/tiny/v1/`)), 'copies are kept while the base lives');
  await storage.destroyBase(base);
  t.same((await datasets()).filter((d) => d.includes('/shifted/') || d.includes('/bases/tiny')), [], 'the copies went with the base');
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'again'));
  t.equal(read(await storage.createBoxRoot('bidsg', { kind: 'base', base }, 1, p1), 'f'), 'again', 'a base made again gets a fresh copy');
  await storage.destroyBoxRoot('bidsg');
  await storage.destroyBase(base);
});

t.test('a half-made base copy whose maker is gone is made again', async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const p3 = projectIdMap(3);
  const copy = `${pool}/shifted/tiny/v1/${p3.hostId}`;
  await run(['zfs', 'create', '-p', `${pool}/shifted/tiny/v1`], { lockFile: ZFS_FUSE_MOUNT_LOCK });
  await run(['zfs', 'clone', '-o', 'boxhost:maker=999999999', `${pool}/bases/tiny/v1@base`, copy], { lockFile: ZFS_FUSE_MOUNT_LOCK });
  const root = await storage.createBoxRoot('bhalf', { kind: 'base', base }, 1, p3);
  t.same(owner(path.join(root, 'f')), [p3.hostId, p3.hostId]);
  t.ok((await datasets('snapshot')).includes(`${copy}@base`));
  await storage.destroyBoxRoot('bhalf');
  await storage.destroyBase(base);
});

t.test("a root is mounted behind its range's own directory: another range's host user reaches none of it", async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const [pa, pb] = [projectIdMap(6), projectIdMap(7)];
  const root = await storage.createBoxRoot('brangea', { kind: 'base', base }, 1, pa);
  await storage.prepareBoxRoot('brangea', pa);
  const rangeDir = path.join(dataDir, 'zfs', 'mnt', 'by-range', String(pa.hostId));
  t.ok(fs.lstatSync(root).isSymbolicLink(), "the root's path links to its mount");
  t.equal(fs.realpathSync(root), path.join(rangeDir, 'boxes', 'brangea'));
  const st = fs.lstatSync(rangeDir);
  t.same([st.uid, st.gid, st.mode & 0o7777], [0, pa.hostId, 0o750], 'root:<range> 0750');
  t.equal(fs.lstatSync(path.dirname(rangeDir)).mode & 0o7777, 0o711, 'the ranges are entered, not listed');
  fs.writeFileSync(path.join(root, 'tmp-open'), 'secret', { mode: 0o666 });
  // What the runtime does before a start: the path down to the root opened for traversal,
  // except what the range enters already (its own directory stays 0750).
  await new HostPaths().makeReachable([fs.realpathSync(root)], pa.hostId);
  t.equal(fs.lstatSync(rangeDir).mode & 0o7777, 0o750, 'the range directory is not opened to everyone');
  const as = (uid: number, script: string) => run(['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', 'sh', '-c', script], { allowFailure: true });
  // As an escape from a box would be: its range's first host id, on the host.
  t.equal((await as(pa.hostId, `cat ${root}/tmp-open`)).stdout, 'secret', "positive control: the root's own range reads it");
  const other = await as(pb.hostId, `cat ${root}/tmp-open; cat ${fs.realpathSync(root)}/tmp-open; echo x > ${fs.realpathSync(root)}/planted`);
  t.notOk(other.stdout.includes('secret'), 'another range reads nothing of it');
  t.match(other.stderr, /Permission denied/);
  t.notOk(fs.existsSync(path.join(root, 'planted')), 'nor writes into it');
  t.equal((await as(pb.hostId, `ls ${path.dirname(rangeDir)}`)).exitCode === 0, false, 'nor lists the ranges');

  // Modes an operator's chmod or a umask could leave: set right again at the next start, and
  // another range's start never opens this range's directory to everyone.
  const rootB = await storage.createBoxRoot('brangeb', { kind: 'base', base }, 1, pb);
  fs.chmodSync(path.dirname(rangeDir), 0o700);
  await new HostPaths().makeReachable([fs.realpathSync(rootB)], pb.hostId);
  t.equal(fs.lstatSync(rangeDir).mode & 0o7777, 0o750, "another range's start, opening the parent, leaves this range its group's access");
  fs.chmodSync(path.dirname(rangeDir), 0o700);
  fs.chmodSync(rangeDir, 0o700);
  await new HostPaths().makeReachable([fs.realpathSync(rootB)], pb.hostId);
  t.equal(fs.lstatSync(rangeDir).mode & 0o7777, 0o700, "and never opens this range's directory to everyone");
  await storage.prepareBoxRoot('brangea', pa);
  t.equal(fs.lstatSync(rangeDir).mode & 0o7777, 0o750, "the range's own start sets its directory right");
  t.equal(fs.lstatSync(path.dirname(rangeDir)).mode & 0o7777, 0o711, 'and the parent');
  // A link lost (a run that died between the clone and the link) is made again at the start.
  fs.unlinkSync(root);
  await storage.prepareBoxRoot('brangea', pa);
  t.ok(fs.lstatSync(root).isSymbolicLink(), 'the link is back');
  t.equal(read(root, 'tmp-open'), 'secret');
  await storage.destroyBoxRoot('brangeb');
  await storage.destroyBoxRoot('brangea');
  t.notOk(fs.existsSync(root), 'the link goes with the root');
  t.notOk(fs.existsSync(path.join(rangeDir, 'boxes', 'brangea')), 'and its mountpoint');
  await storage.destroyBase(base);
});

t.test('a root made before user namespaces is shifted in place at its next start', async (t) => {
  await storage.createBase(base, async (dir) => {
    fs.mkdirSync(path.join(dir, 'home/box'), { recursive: true });
    fs.chownSync(path.join(dir, 'home/box'), 1000, 1000);
  });
  const p4 = projectIdMap(4);
  // As an older version made it: a clone of the base itself, refquota only, no id property.
  const old = await storage.createBoxRoot('bolder', { kind: 'base', base });
  await run(['zfs', 'set', 'refquota=1G', `${pool}/boxes/bolder`]);
  fs.writeFileSync(path.join(old, 'mine'), 'mine');
  await storage.snapshotBoxRoot('bolder', 'before');
  t.same(owner(fs.realpathSync(old)), [0, 0], 'unshifted');

  await timed('prepareBoxRoot (shift in place)', () => storage.prepareBoxRoot('bolder', p4));
  t.same(owner(fs.realpathSync(old)), [p4.hostId, p4.hostId]);
  t.same(owner(path.join(old, 'mine')), [p4.hostId, p4.hostId]);
  t.same(owner(path.join(old, 'home/box')), [p4.hostId + 1000, p4.hostId + 1000]);
  t.equal(await zfsValue(`${pool}/boxes/bolder`, 'boxhost:idmap'), String(p4.hostId), 'recorded, so it happens once');
  t.equal(await zfsValue(`${pool}/boxes/bolder`, 'quota'), String(1024 ** 3), 'its refquota became its quota too');
  t.equal(await zfsValue(`${pool}/boxes/bolder@before`, 'boxhost:idmap'), 'none', 'the older snapshot holds unshifted files, and says so');
  messages.length = 0;
  await storage.prepareBoxRoot('bolder', p4);
  t.same(messages.filter((m) => m.includes('shifted a box root')), [], 'the second start shifts nothing');
  t.ok(fs.lstatSync(storage.boxRootPath('bolder')).isSymbolicLink(), 'a root of the old layout is moved behind its range at its start; its old path links to it');
  t.equal(fs.realpathSync(storage.boxRootPath('bolder')), path.join(dataDir, 'zfs', 'mnt', 'by-range', String(p4.hostId), 'boxes', 'bolder'));
  t.equal(read(storage.boxRootPath('bolder'), 'mine'), 'mine', 'with its files');
  t.match(mountOptions(fs.realpathSync(storage.boxRootPath('bolder'))), /\bnosuid\b/, 'mounted nosuid there');

  const fromOld = await storage.createBoxRoot('bfromold', { kind: 'box', boxId: 'bolder', snapshot: 'before' }, 1, p4);
  t.same(owner(fs.realpathSync(fromOld)), [0, 0], 'a fork of the older snapshot is cloned as it was');
  await storage.prepareBoxRoot('bfromold', p4);
  t.same(owner(path.join(fromOld, 'mine')), [p4.hostId, p4.hostId], 'and shifted at its first start');
  const fromNew = await storage.createBoxRoot('bfromnew', { kind: 'box', boxId: 'bolder' }, 1, p4);
  t.same(owner(path.join(fromNew, 'mine')), [p4.hostId, p4.hostId], 'a fork of it as it is now is in range at once');
  for (const id of ['bfromold', 'bfromnew', 'bolder']) await storage.destroyBoxRoot(id);
  await storage.destroyBase(base);
});

t.test('storage_gb bounds what a root holds with its snapshots and forks', async (t) => {
  await storage.createBase(base, async (dir) => fs.writeFileSync(path.join(dir, 'f'), 'f'));
  const quota = 1 / 16; // GB: 64 MiB, written 48 MB at a time
  for (const keeper of ['snapshot', 'fork'] as const) {
    const id = `bquota${keeper === 'fork' ? 'f' : 's'}`;
    const root = await storage.createBoxRoot(id, { kind: 'base', base }, quota, projectIdMap(5));
    const write = (name: string, mb: number) => run(['dd', 'if=/dev/urandom', `of=${path.join(root, name)}`, 'bs=1M', `count=${mb}`, 'conv=fsync'], { allowFailure: true });
    t.equal((await write('a', 48)).exitCode, 0, `${keeper}: 48 MB fit`);
    if (keeper === 'snapshot') await storage.snapshotBoxRoot(id, 'keep');
    else await storage.createBoxRoot(`${id}x`, { kind: 'box', boxId: id }, quota, projectIdMap(5));
    fs.rmSync(path.join(root, 'a'));
    // A removed file's blocks are freed when its transaction group is written, which zfs-fuse
    // does on its own only every 30 s (this test waited 2 × 30 s for it): a property set is a
    // sync task, which writes the open group at once. Then wait until the root itself references
    // little, so that only what the snapshot or fork keeps counts.
    await run(['zfs', 'set', 'boxhost:test-sync=1', `${pool}/boxes/${id}`]);
    for (let i = 0; i < 120 && Number(await zfsValue(`${pool}/boxes/${id}`, 'referenced')) > 16 * 2 ** 20; i++) await new Promise((r) => setTimeout(r, 500));
    // Else refquota alone would refuse the next write, and the test would pass without quota.
    t.ok(Number(await zfsValue(`${pool}/boxes/${id}`, 'referenced')) <= 16 * 2 ** 20, `${keeper}: the root itself no longer references the removed file`);
    const over = await write('b', 48);
    t.not(over.exitCode, 0, `${keeper}: another 48 MB do not, the first being kept by the ${keeper}`);
    t.match(over.stderr, /quota|space/i);
    t.ok(Number(await zfsValue(`${pool}/boxes/${id}`, 'referenced')) < quota * 1024 ** 3, `${keeper}: although what the root itself references is under its refquota`);
    await storage.destroyBoxRoot(id);
    if (keeper === 'fork') await storage.destroyBoxRoot(`${id}x`);
  }
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

t.test('the loop-file pool must fit its filesystem, and health says when its growth no longer would', async (t) => {
  // A small filesystem of its own, so that "full" is cheap to reach.
  const fsDir = fs.mkdtempSync(path.join(dataDir, 'small-'));
  await run(['mount', '-t', 'tmpfs', '-o', 'size=400m', 'tmpfs', fsDir]);
  t.teardown(() => run(['umount', '-l', fsDir], { allowFailure: true }));
  const tag = `zs${crypto.randomBytes(3).toString('hex')}`;

  const tooBig = new ZfsStorage({ dataDir: fsDir, poolSizeGb: 1, hostTag: tag, logger });
  await t.rejects(tooBig.init(), /would be 1\.0 GiB \(BOXHOST_POOL_SIZE_GB\), but its filesystem has only 400 MiB free/);
  t.notOk(fs.existsSync(path.join(fsDir, 'zfs', 'pool.img')), 'no pool file made');

  const small = new ZfsStorage({ dataDir: fsDir, poolSizeGb: 0.25, hostTag: tag, logger });
  t.teardown(() => small.destroyPool().catch(() => undefined));
  await small.init();
  await small.health();
  // The host filesystem fills up (something else writes there): 256 MiB of pool can no
  // longer grow into what is left.
  const filler = path.join(fsDir, 'filler');
  await run(['dd', 'if=/dev/zero', `of=${filler}`, 'bs=1M', 'count=300']);
  await t.rejects(small.health(), /can grow \d+ MiB more, but its filesystem has only \d+ MiB free/);
  fs.rmSync(filler);
  await small.health();
  await small.destroyPool();
});
