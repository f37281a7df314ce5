import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import t from 'tap';
import { run } from '../core/command';
import { startTestHost } from './helpers/host';

/**
 * Data volumes on real boxes, ZFS and BullMQ (docs/data.md): create / list / get / delete, a box
 * made with `data_mounts`, attach (the forbidden path table, read_only enforced by the kernel)
 * and detach at the next start, data snapshots and a restore to one, backups (the name table,
 * full then incremental, 50 MiB of random data back byte for byte from each, a corrupted stream
 * refused with the volume untouched), and another project's token kept out.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

t.test('data volumes on real boxes', async (t) => {
  const host = await startTestHost(t, { BOXHOST_DATA_DEFAULT_GB: '2' });
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const P = '/v1/projects/vol/boxes';
  const sh = async (box: string, script: string) => {
    const r = await call('POST', `${P}/${box}/exec`, { command: ['sh', '-c', script] });
    if (r.status !== 200) throw new Error(`exec in ${box}: ${r.status} ${r.text}`);
    return r.body as { stdout: string; stderr: string; exit_code: number };
  };
  const waitOp = async (r: { status: number; headers: Headers; text: string }) => {
    if (r.status !== 202) throw new Error(`not accepted: ${r.status} ${r.text}`);
    return (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=180`)).body;
  };
  const stop = async (box: string) => t.equal((await waitOp(await call('POST', `${P}/${box}/stop`))).status, 'succeeded', `${box} stopped`);
  const resume = async (box: string) => t.equal((await waitOp(await call('POST', `${P}/${box}/resume`))).status, 'succeeded', `${box} resumed`);

  t.test('create, list, get, the name rules', async (t) => {
    const r = await call('POST', '/v1/data', { name: 'vol-a', description: 'first' });
    t.equal(r.status, 201, r.text);
    t.match(r.body, { name: 'vol-a', quota_gb: 2, description: 'first', attachments: [], project: null });
    t.match(r.body.created_at, ISO);
    t.ok(Number.isInteger(r.body.size_bytes) && r.body.size_bytes >= 0);
    t.equal(r.headers.get('location'), '/v1/data/vol-a');
    t.equal((await call('POST', '/v1/data', { name: 'vol-a' })).status, 409, 'a name in use');
    for (const bad of [{}, { name: '' }, { name: 'A' }, { name: 'a--b' }, { name: '-a' }, { name: 'a'.repeat(64) }, { name: 'ok', size_gb: 0 }, { name: 'ok', size_gb: 1.5 }, { name: 'ok', size_gb: '1' }, { name: 'ok', extra: 1 }]) {
      const res = await call('POST', '/v1/data', bad);
      t.equal(res.status, 400, `400 for ${JSON.stringify(bad).slice(0, 60)}`);
      t.equal(res.body.error.code, 'invalid_argument');
    }
    const huge = await call('POST', '/v1/data', { name: 'huge', size_gb: 16000 });
    t.equal(huge.status, 507, huge.text);
    t.same(huge.body.error.details.map((d: any) => d.field), ['size_gb'], 'the refusal names the field asked with');
    t.match(huge.body.error.message, /room for 16000 GB storage more/);
    t.notMatch(huge.body.error.message, /cpus|RAM/, 'a volume asks for storage only');
    const l = await call('GET', '/v1/data');
    t.equal(l.status, 200);
    t.same(l.body.volumes.map((v: any) => v.name), ['vol-a']);
    const g = await call('GET', '/v1/data/vol-a');
    t.same(g.body, l.body.volumes[0]);
    t.equal((await call('GET', '/v1/data/nope')).status, 404);
  });

  t.test('a box made with data_mounts writes to it; its record shows the mount', async (t) => {
    const made = await call('POST', `${P}?wait=120`, { name: 'w', data_mounts: [{ name: 'vol-a', path: '/data' }] });
    t.equal(made.body.status, 'running', made.text);
    t.same(made.body.data_mounts, [{ name: 'vol-a', path: '/data', read_only: false, ownership: { kind: 'persistent' } }]);
    const w = await sh('w', 'echo hello > /data/f && cat /data/f && id -u');
    t.equal(w.exit_code, 0, w.stderr);
    t.equal(w.stdout, 'hello\n0\n');
    // The volume's mount, as the box sees it: no setuid programs, no device nodes.
    const mi = await sh('w', "awk '$5 == \"/data\" { print $6 }' /proc/self/mountinfo");
    t.match(mi.stdout, /^\S+\n$/, `one mount at /data (${JSON.stringify(mi.stdout)})`);
    t.match(mi.stdout, /(^|,)nosuid(,|$)/m, 'mounted nosuid');
    t.match(mi.stdout, /(^|,)nodev(,|$)/m, 'and nodev');
    // After an escape, a box's processes are its range's host users: the volume's files (this
    // one world-readable) are out of reach on the host of its own range and of every other one.
    // runc opens a bind mount's source as the host's root, so the box has them all the same.
    const dataRoot = path.join(host.config.dataDir, 'zfs', 'mnt', 'data');
    const [vid] = fs.readdirSync(dataRoot);
    const own = fs.statSync(path.join(dataRoot, vid)).uid;
    t.ok(own >= 1000000, `the volume's top directory is its range's (${own})`);
    const st = fs.statSync(dataRoot);
    t.same([st.uid, st.gid, st.mode & 0o7777], [0, 0, 0o700], "the volumes' directory is the host root's alone");
    const as = (uid: number) => run(['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', 'cat', path.join(dataRoot, vid, 'f')], { allowFailure: true });
    for (const uid of [own, own + 65536]) {
      const r = await as(uid);
      t.not(r.exitCode, 0, `host user ${uid} cannot read the volume's file`);
      t.match(r.stderr, /Permission denied/);
    }
    fs.chmodSync(dataRoot, 0o755);
    try {
      t.equal((await as(own + 65536)).stdout, 'hello\n', 'positive control: through an open directory, any range would read it');
    } finally {
      fs.chmodSync(dataRoot, 0o700);
    }
    const v = (await call('GET', '/v1/data/vol-a')).body;
    t.same(v.attachments, [{ project: 'vol', box: 'w', path: '/data', read_only: false }]);
    t.equal(v.project, 'vol', 'the volume joined the project of its first box');
    const missing = await call('POST', P, { name: 'w2', data_mounts: [{ name: 'nope', path: '/data' }] });
    t.equal(missing.status, 400, 'an unknown volume');
    t.equal(missing.body.error.details[0].field, 'data_mounts.0.name');
    t.equal((await call('POST', P, { name: 'w3', data_mounts: [{ name: 'vol-a', path: '/etc/' }] })).status, 400, 'a forbidden path at create');
    const under = await call('POST', P, { name: 'w3', data_mounts: [{ name: 'vol-a', path: '/proc/x' }] });
    t.equal(under.status, 400, 'a path under /proc at create');
    t.equal(under.body.error.details[0].field, 'data_mounts.0.path');
  });

  t.test('attach: the forbidden path table, read_only, next start, detach', async (t) => {
    t.equal((await call('POST', '/v1/data', { name: 'vol-b', size_gb: 1 })).status, 201);
    for (const p of ['/', '/proc', '/sys', '/dev', '/run', '/etc', '/volumes', '/home', '/box', '/etc/', '/./etc', '/home/../etc', '//proc', 'data', '', '/.boxhost', '/.boxhost/x', '/proc/x', '/sys/fs/x', '/dev/shm', '/dev/x/y', '/etc/hostname', '/srv/x/../../etc/hostname', '/etc/boxes-env', '/etc/hostname/x']) {
      const r = await call('POST', '/v1/data/vol-b/attach', { project: 'vol', box: 'w', path: p });
      t.equal(r.status, 400, `400 for ${JSON.stringify(p)}: ${r.text.slice(0, 120)}`);
      t.equal(r.body.error.code, 'invalid_argument');
    }
    t.equal((await call('POST', '/v1/data/vol-b/attach', { project: 'vol', box: 'w', path: '/data/sub' })).status, 400, 'a path inside another mount');
    t.equal((await call('POST', '/v1/data/vol-b/attach', { project: 'vol', box: 'nope', path: '/ro' })).status, 404, 'an unknown box');
    const a = await call('POST', '/v1/data/vol-b/attach', { project: 'vol', box: 'w', path: '/srv/./ro/', read_only: true });
    t.equal(a.status, 200, a.text);
    t.same(a.body.data_mounts.map((m: any) => [m.name, m.path, m.read_only, m.ownership.kind]), [['vol-a', '/data', false, 'persistent'], ['vol-b', '/srv/ro', true, 'persistent']]);
    t.equal((await call('POST', '/v1/data/vol-b/attach', { project: 'vol', box: 'w', path: '/other' })).status, 409, 'attached twice');
    t.not((await sh('w', 'test -d /srv/ro')).exit_code, 0, 'a running box gets it at its next start');
    await stop('w');
    await resume('w');
    const ro = await sh('w', 'ls -d /srv/ro && touch /srv/ro/x; echo rc=$?; cat /data/f');
    t.match(ro.stdout, /rc=1/, 'read_only: the kernel refuses the write');
    t.match(ro.stderr, /Read-only file system/);
    t.match(ro.stdout, /hello/, 'the first volume kept its file across the restart');

    const busy = await call('DELETE', '/v1/data/vol-b');
    t.equal(busy.status, 409, 'delete while attached');
    t.match(busy.body.error.message, /vol\/w/);
    const d = await call('POST', '/v1/data/vol-b/detach', { project: 'vol', box: 'w' });
    t.equal(d.status, 200, d.text);
    t.same(d.body.data_mounts.map((m: any) => m.name), ['vol-a']);
    t.equal((await call('POST', '/v1/data/vol-b/detach', { project: 'vol', box: 'w' })).status, 409, 'not attached');
    t.same((await call('GET', '/v1/data/vol-b')).body.attachments, [], 'no longer listed');
    const held = await call('DELETE', '/v1/data/vol-b');
    t.equal(held.status, 409, 'the running box still has it mounted');
    t.match(held.body.error.message, /still mounted in box vol\/w/);
    t.equal((await sh('w', 'ls -d /srv/ro')).exit_code, 0, 'until it stops');
    await stop('w');
    t.equal((await call('DELETE', '/v1/data/vol-b')).status, 204);
    await resume('w');
    t.not((await sh('w', 'ls -d /srv/ro/x 2>/dev/null; mountpoint -q /srv/ro')).exit_code, 0, 'gone after the restart');
    t.equal((await call('GET', '/v1/data/vol-b')).status, 404);
  });

  t.test('detach from a running box that never mounted the volume lets go of it at once', async (t) => {
    t.equal((await call('POST', '/v1/data', { name: 'vol-c', size_gb: 1 })).status, 201);
    // Attached after w's start: w's container never had it.
    t.equal((await call('POST', '/v1/data/vol-c/attach', { project: 'vol', box: 'w', path: '/late' })).status, 200);
    t.equal((await call('DELETE', '/v1/data/vol-c')).status, 409, 'attached: held');
    t.equal((await call('POST', '/v1/data/vol-c/detach', { project: 'vol', box: 'w' })).status, 200);
    const snap = await call('POST', '/v1/data/vol-c/snapshots', { name: 's1' });
    t.equal(snap.status, 201, snap.text);
    const restored = await call('POST', '/v1/data/vol-c/restore?wait=60', { snapshot: 's1' });
    t.equal(restored.status, 200, `restore runs while w runs: it never mounted vol-c (${restored.text.slice(0, 160)})`);
    const mountedAtLate = "awk '$5 == \"/late\"' /proc/self/mountinfo | grep -q .";
    t.not((await sh('w', mountedAtLate)).exit_code, 0, 'and w has no mount there');

    // Positive control: attached, mounted by a start, detached, attached again while w still
    // has it mounted, detached again: still held until w stops.
    t.equal((await call('POST', '/v1/data/vol-c/attach', { project: 'vol', box: 'w', path: '/late' })).status, 200);
    await stop('w');
    await resume('w');
    t.equal((await sh('w', mountedAtLate)).exit_code, 0, 'mounted at the start');
    t.equal((await call('POST', '/v1/data/vol-c/detach', { project: 'vol', box: 'w' })).status, 200);
    t.equal((await call('POST', '/v1/data/vol-c/attach', { project: 'vol', box: 'w', path: '/late' })).status, 200, 'attached again while still mounted');
    t.equal((await call('POST', '/v1/data/vol-c/detach', { project: 'vol', box: 'w' })).status, 200);
    const held = await call('POST', '/v1/data/vol-c/restore', { snapshot: 's1' });
    t.equal(held.status, 409, 'the running box still has it mounted');
    t.match(held.body.error.message, /vol\/w/);
    t.equal((await call('DELETE', '/v1/data/vol-c')).status, 409, 'nor deleted under it');
    await stop('w');
    t.equal((await call('DELETE', '/v1/data/vol-c')).status, 204, 'free once w stopped');
    await resume('w');
  });

  t.test('another project cannot see or reach a volume', async (t) => {
    const other = (await call('POST', '/v1/tokens', { name: 'other-vol', projects: ['other'] })).body.token;
    const as = (method: string, p: string, body?: unknown) => host.call(method, p, { body, token: other });
    t.equal((await as('GET', '/v1/data/vol-a')).status, 404);
    t.same((await as('GET', '/v1/data')).body.volumes, []);
    t.equal((await as('DELETE', '/v1/data/vol-a')).status, 404);
    t.equal((await as('POST', '/v1/data/vol-a/snapshots', { name: 'x' })).status, 404);
    t.equal((await as('POST', '/v1/data/vol-a/backups', {})).status, 404);
    t.equal((await as('POST', '/v1/data', { name: 'vol-x', project: 'vol' })).status, 404, 'nor made in a project this token does not reach');
    const mine = await as('POST', '/v1/data', { name: 'vol-other', size_gb: 1 });
    t.equal(mine.status, 201, mine.text);
    t.equal(mine.body.project, 'other', "a project token's volume is its project's");
    const cross = await call('POST', '/v1/data/vol-other/attach', { project: 'vol', box: 'w', path: '/x' });
    t.equal(cross.status, 409, "the admin cannot attach project other's volume to a box of vol");
    t.equal((await as('DELETE', '/v1/data/vol-other')).status, 204);
  });

  t.test('data snapshots: create, list, restore brings the old file back, delete', async (t) => {
    await sh('w', 'echo one > /data/f');
    const s = await call('POST', '/v1/data/vol-a/snapshots', { name: 's1', description: 'before' });
    t.equal(s.status, 201, s.text);
    t.same(Object.keys(s.body).sort(), ['created_at', 'description', 'name', 'size_bytes']);
    t.equal((await call('POST', '/v1/data/vol-a/snapshots', { name: 's1' })).status, 409);
    t.equal((await call('POST', '/v1/data/vol-a/snapshots', { name: 'Bad' })).status, 400);
    await sh('w', 'echo two > /data/f');
    const l = await call('GET', '/v1/data/vol-a/snapshots');
    t.same(l.body.snapshots.map((x: any) => x.name), ['s1']);

    const running = await call('POST', '/v1/data/vol-a/restore', { snapshot: 's1' });
    t.equal(running.status, 409, 'restore while a box that mounts it runs');
    t.equal((await call('POST', '/v1/data/vol-a/restore', { snapshot: 's1', backup: 'x' })).status, 400, 'both');
    t.equal((await call('POST', '/v1/data/vol-a/restore', {})).status, 400, 'neither');
    await stop('w');
    t.equal((await call('POST', '/v1/data/vol-a/snapshots', { name: 's2' })).status, 201);
    const later = await call('POST', '/v1/data/vol-a/restore', { snapshot: 's1' });
    t.equal(later.status, 409, 'a later snapshot would be lost');
    t.match(later.body.error.message, /s2/);
    t.equal((await call('DELETE', '/v1/data/vol-a/snapshots/s2')).status, 204);
    t.equal((await waitOp(await call('POST', '/v1/data/vol-a/restore', { snapshot: 's1' }))).status, 'succeeded');
    await resume('w');
    t.equal((await sh('w', 'cat /data/f')).stdout, 'one\n', 'the snapshot\'s file is back');
    t.equal((await call('DELETE', '/v1/data/vol-a/snapshots/s1')).status, 204);
    t.equal((await call('DELETE', '/v1/data/vol-a/snapshots/s1')).status, 404);
  });

  t.test('backups: names, full then incremental, 50 MiB back byte for byte, a corrupt stream refused', async (t) => {
    for (const bad of ['', '-a', 'a-', 'a--b', 'A', 'a_b', 'a'.repeat(64)]) {
      const r = await call('POST', '/v1/data/vol-a/backups', { name: bad });
      t.equal(r.status, 400, `400 for ${JSON.stringify(bad)}`);
    }
    await sh('w', 'head -c 52428800 /dev/urandom > /data/blob && sync');
    const first = (await sh('w', 'sha256sum /data/blob')).stdout.split(' ')[0];
    const full = await call('POST', '/v1/data/vol-a/backups?wait=180', { name: 'a', description: 'full one' });
    t.equal(full.status, 200, full.text);
    t.match(full.body, { name: 'a', status: 'completed', mode: 'full', parent: null, description: 'full one', error: null });
    t.match(full.body.sha256, /^[0-9a-f]{64}$/);
    t.ok(full.body.size_bytes > 50 * 1024 * 1024, 'the stream holds the data');

    await sh('w', 'head -c 1048576 /dev/urandom | dd of=/data/blob bs=1M seek=3 conv=notrunc 2>/dev/null && echo more > /data/g && sync');
    const second = (await sh('w', 'sha256sum /data/blob')).stdout.split(' ')[0];
    t.not(second, first);
    const incr = await call('POST', '/v1/data/vol-a/backups', { description: null });
    t.equal(incr.status, 202, incr.text);
    t.match(incr.body, { status: 'pending' });
    t.match(incr.body.name, /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/, 'a generated name obeys the rule');
    t.notOk(incr.body.name.includes('--'));
    t.equal((await waitOp(incr)).status, 'succeeded');
    const got = (await call('GET', `/v1/data/vol-a/backups/${incr.body.name}`)).body;
    t.match(got, { status: 'completed', mode: 'incremental', parent: 'a' });
    t.ok(got.size_bytes < full.body.size_bytes / 4, `the incremental is small (${got.size_bytes} bytes)`);
    t.equal((await call('POST', '/v1/data/vol-a/backups', { name: 'a' })).status, 409, 'a backup name in use');
    t.same((await call('GET', '/v1/data/vol-a/backups')).body.backups.map((b: any) => b.name), ['a', incr.body.name]);
    t.equal((await call('GET', '/v1/data/vol-a/backups/none')).status, 404);

    await stop('w');
    t.equal((await call('POST', '/v1/data/vol-a/restore?wait=180', { backup: 'a' })).status, 200, 'restore the full backup');
    await resume('w');
    t.equal((await sh('w', 'sha256sum /data/blob')).stdout.split(' ')[0], first, 'the full backup brings the first data back');
    t.not((await sh('w', 'test -e /data/g')).exit_code, 0);
    await stop('w');
    t.equal((await call('POST', '/v1/data/vol-a/restore?wait=180', { backup: incr.body.name })).status, 200, 'restore the incremental');
    await resume('w');
    t.equal((await sh('w', 'sha256sum /data/blob')).stdout.split(' ')[0], second, 'full + incremental bring the second data back');
    t.equal((await sh('w', 'cat /data/g')).stdout, 'more\n');

    // One byte changed in the full stream: both restores that need it are refused, the volume as it was.
    const vol = (await call('GET', '/v1/data/vol-a')).body;
    const id = fs.readdirSync(host.config.backupDir)[0];
    const stream = path.join(host.config.backupDir, id, 'a.zfs');
    t.ok(fs.existsSync(path.join(host.config.backupDir, id, 'a.json')), 'a manifest beside the stream');
    const fd = fs.openSync(stream, 'r+');
    const b = Buffer.alloc(1);
    fs.readSync(fd, b, 0, 1, 4096);
    b[0] ^= 0xff;
    fs.writeSync(fd, b, 0, 1, 4096);
    fs.closeSync(fd);
    await stop('w');
    const bad = await call('POST', '/v1/data/vol-a/restore?wait=180', { backup: incr.body.name });
    t.equal(bad.status, 409, bad.text);
    t.match(bad.body.error.message, /corrupt/);
    await resume('w');
    t.equal((await sh('w', 'sha256sum /data/blob')).stdout.split(' ')[0], second, 'the volume was not touched');
    t.ok(vol.size_bytes > 50 * 1024 * 1024, 'size_bytes counts the data');
  });

  t.test('the CLI: box data create/ls/get/attach/snapshot/backup/backups/restore/detach/rm, box create --data', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'vol', XDG_CONFIG_HOME: host.config.dataDir };
    const box = (...args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }));
      });
    const ok = async (...args: string[]) => {
      const r = await box(...args);
      t.equal(r.code, 0, `box ${args.join(' ')}: ${r.stderr}`);
      return r;
    };
    t.match((await ok('data', 'create', 'cli-vol', '--size-gb', '1', '-d', 'from the cli')).stdout, /created data volume cli-vol \(1 GB/);
    const made = JSON.parse((await ok('--json', 'create', 'c', '--data', 'cli-vol:/mnt/v', '--wait')).stdout);
    t.equal(made.status, 'succeeded');
    t.match((await ok('data', 'ls')).stdout, /cli-vol\s+vol\s+.*vol\/c:\/mnt\/v/);
    t.equal(JSON.parse((await ok('--json', 'data', 'get', 'cli-vol')).stdout).attachments[0].path, '/mnt/v');
    t.match((await ok('get', 'c')).stdout, /^data:\s+cli-vol at \/mnt\/v$/m, 'box get shows its data mounts');
    t.equal((await sh('c', 'echo x > /mnt/v/x && cat /mnt/v/x')).stdout, 'x\n');
    await ok('data', 'snapshot', 'create', 'cli-vol', 'first', '-d', 'one');
    t.match((await ok('data', 'snapshot', 'ls', 'cli-vol')).stdout, /first/);
    const b = JSON.parse((await ok('--json', 'data', 'backup', 'cli-vol', '--name', 'nightly', '--wait')).stdout);
    t.match(b, { name: 'nightly', status: 'completed', mode: 'full' });
    t.match((await ok('data', 'backups', 'cli-vol')).stdout, /nightly\s+completed\s+full/);
    const refused = await box('data', 'restore', 'cli-vol', '--backup', 'nightly', '--wait');
    t.equal(refused.code, 1, 'a restore under a running box is refused');
    t.match(refused.stderr, /attached to box vol\/c/);
    await ok('stop', 'c', '--wait');
    await ok('data', 'restore', 'cli-vol', '--snapshot', 'first', '--wait');
    await ok('data', 'detach', 'cli-vol', 'c');
    await ok('data', 'snapshot', 'rm', 'cli-vol', 'first');
    await ok('data', 'rm', 'cli-vol');
    t.equal((await box('data', 'get', 'cli-vol')).code, 1);
    t.equal((await box('create', 'd', '--data', 'nocolon')).code, 2, 'a bad --data is a usage error');
    await ok('rm', 'c', '--wait');
  });

  t.test('delete: the box first, then the volume with its backups', async (t) => {
    t.equal((await waitOp(await call('DELETE', `${P}/w`))).status, 'succeeded');
    t.same((await call('GET', '/v1/data/vol-a')).body.attachments, [], 'a deleted box lets go of its volumes');
    t.equal((await call('DELETE', '/v1/data/vol-a')).status, 204);
    t.same(fs.readdirSync(host.config.backupDir), [], 'its backups went with it');
  });
});
