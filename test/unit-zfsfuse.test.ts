/**
 * What a node reads of the running zfs-fuse daemon's ARC cap (workers/storage/zfsFuse.ts
 * `daemonArcMb`): the cap bounds how many box roots the node admits, because a full ARC hangs
 * the daemon. No ZFS needed: the "daemons" are node processes with the daemon's arguments.
 * Also the mount options a node reads of /proc/self/mountinfo (hostFs `mountFlagsIn`).
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t, { type Test } from 'tap';
import { daemonArcMb, processStartMs } from '../workers/storage/zfsFuse';
import { isPrivateMount, mountFlagsIn } from '../workers/storage/hostFs';
import { mayMount } from '../workers/storage/zfsCommon';
import { NOT_STARTED, ZfsDatasets } from '../workers/storage/zfsDatasets';

const old = (text: string) => ({ text, mtimeMs: 0 });

/** A process whose command line ends with `args`, as the daemon's would. */
function fakeDaemon(t: Test, ...args: string[]): number {
  const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)', '--', ...args], { stdio: 'ignore' });
  t.teardown(() => void child.kill('SIGKILL'));
  return child.pid!;
}

t.test('from zfsrc when the daemon was given no cap', async (t) => {
  t.equal(daemonArcMb(null, old('vdev-cache-size = 10\nmax-arc-size = 300\n')), 300);
  t.equal(daemonArcMb(null, old('# max-arc-size = 7\n')), 100, 'commented out: set nowhere, 100 (Debian\'s zfsrc value)');
  t.equal(daemonArcMb(null, old('')), 100, 'no zfsrc: 100');
  t.equal(daemonArcMb(null, old('max-arc-size = 100\nmax-arc-size = 1024\n')), 1024, 'the last line wins, as zfs-fuse reads it');
  t.equal(daemonArcMb(null, old('max-arc-size = 512   # raised for boxhost\n')), 512, 'a trailing comment is allowed');
  t.equal(daemonArcMb(null, old('max-arc-size = lots\n')), 100, 'not a number: ignored');
});

t.test('from the daemon\'s own arguments first', async (t) => {
  const conf = old('max-arc-size = 300\n');
  t.equal(daemonArcMb(fakeDaemon(t, '--pidfile', '/x', '--max-arc-size', '2048'), conf), 2048, '--max-arc-size N');
  t.equal(daemonArcMb(fakeDaemon(t, '--max-arc-size=640'), conf), 640, '--max-arc-size=N');
  t.equal(daemonArcMb(fakeDaemon(t, '-m512'), conf), 512, '-mN');
  t.equal(daemonArcMb(fakeDaemon(t, '-m', '256'), conf), 256, '-m N');
  t.equal(daemonArcMb(fakeDaemon(t, '--pidfile', '/x'), conf), 300, 'none: zfsrc');
});

t.test('a zfsrc changed after the daemon started says nothing about it', async (t) => {
  const pid = fakeDaemon(t, '--pidfile', '/x');
  const started = processStartMs(pid);
  t.ok(started !== null && Math.abs(started - Date.now()) < 60_000, `the start time is read from /proc (${started})`);
  t.equal(daemonArcMb(pid, { text: 'max-arc-size = 1024\n', mtimeMs: Date.now() + 5000 }), 100, 'edited since: the daemon may still run on 100');
  t.equal(daemonArcMb(pid, { text: 'max-arc-size = 1024\n', mtimeMs: started! - 5000 }), 1024, 'edited before it started: what it read');
});

t.test('mountFlagsIn: the options of the last mount at exactly that point', async (t) => {
  const info = [
    '22 1 0:21 / /var/tmp/d/mnt/boxes/b1 rw,relatime shared:1 - fuse.zfs p/boxes/b1 rw',
    // a bind mount whose root in its filesystem is the same text: not a mount at that point
    '23 1 0:22 /var/tmp/d/mnt/boxes/b2 /run/other rw - fuse.zfs p/boxes/b2 rw',
    '24 1 0:23 / /var/tmp/d/mnt/boxes/b1 rw,nosuid,nodev,relatime shared:2 - fuse.zfs p/boxes/b1 rw',
    '25 1 0:24 / /var/tmp/d/mnt/boxes/b1x rw - fuse.zfs p/boxes/b1x rw',
    '26 1 0:25 / /var/tmp/with\\040space rw,nosuid - tmpfs t rw',
    '',
  ].join('\n');
  t.same([...mountFlagsIn(info, '/var/tmp/d/mnt/boxes/b1')!], ['rw', 'nosuid', 'nodev', 'relatime'], 'the last mount at the point is the one in effect');
  t.equal(isPrivateMount(mountFlagsIn(info, '/var/tmp/d/mnt/boxes/b1')), true);
  t.same([...mountFlagsIn(info, '/var/tmp/d/mnt/boxes/b1x')!], ['rw'], 'a longer name is another point');
  t.equal(mountFlagsIn(info, '/var/tmp/d/mnt/boxes/b2'), null, 'a bind mount root of that text is not a mount at that point');
  t.same([...mountFlagsIn(info, '/var/tmp/with space')!], ['rw', 'nosuid'], 'spaces are escaped as \\040');
  t.equal(mountFlagsIn(info, '/var/tmp/d/mnt/boxes'), null, 'no mount there');
  t.equal(mountFlagsIn('22 1 0:21 / /x rw - t s rw', '/x')?.has('rw'), true, 'a last line without a newline');
});

t.test('which zfs and zpool commands may mount, and so take turns on zfs-fuse (zfsCommon mayMount)', async (t) => {
  for (const args of [['clone', 'p/a@s', 'p/b'], ['create', '-o', 'quota=1G', 'p/v'], ['mount', 'p/a'], ['rename', 'p/a', 'p/b'], ['rollback', '-r', 'p/a@s'], ['promote', 'p/b'], ['receive', '-F', 'p/v'], ['set', 'mountpoint=/x', 'p/a'], ['inherit', 'canmount', 'p/a']]) {
    t.ok(mayMount(args), `zfs ${args.join(' ')}`);
  }
  for (const args of [['list', '-H'], ['get', 'mountpoint', 'p/a'], ['destroy', '-r', 'p/a'], ['umount', 'p/a'], ['snapshot', 'p/a@s'], ['receive', '-u', 'p/v'], ['set', 'quota=1G', 'p/a'], ['inherit', 'setuid', 'p/a'], ['hold', 't', 'p/a@s']]) {
    t.notOk(mayMount(args), `not zfs ${args.join(' ')}`);
  }
  t.ok(mayMount(['import', '-d', '/d', 'p'], true) && mayMount(['create', '-m', '/m', 'p', '/img'], true), 'zpool import and create');
  t.notOk(mayMount(['list', '-H'], true) || mayMount(['destroy', '-f', 'p'], true) || mayMount(['export', 'p'], true), 'not zpool list, destroy, export');
});

t.test('a command that mounts, whose lock another process holds past its deadline: a failure, never a hung daemon (ZfsDatasets.timed)', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-mountlock-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const lockFile = path.join(dir, 'lock');
  const d = new ZfsDatasets({ pool: 'nopool', root: 'nopool', mountRoot: dir, lockFile: path.join(dir, 'pool.lock'), log: { debug: () => undefined, info: () => undefined, warn: () => undefined }, daemonPid: () => 4242, mountLock: lockFile });
  d.cmdTimeoutMs = 300;
  const holder = spawn('flock', [lockFile, 'sleep', '30'], { stdio: 'ignore', detached: true });
  t.teardown(() => {
    try {
      process.kill(-holder.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  });
  while (spawnSync('flock', ['-n', lockFile, 'true']).status === 0) await new Promise((r) => setTimeout(r, 10));
  const r = await d.zfs(['create', 'nopool/x'], true);
  t.equal(r.exitCode, NOT_STARTED, 'allowFailure: answered as a failure that never started');
  t.match(r.stderr, /was not started: the lock .* was not free/, 'saying why');
  t.equal(d.hungDaemon, undefined, 'the daemon is not taken for hung');
  await t.rejects(d.zfs(['create', 'nopool/y']), { code: 'ETIMEDOUT', syscall: 'flock' }, 'without allowFailure it throws the lock timeout');
  t.equal(d.hungDaemon, undefined, 'still not hung');
});
