import t from 'tap';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { run, sleep } from '../core/command';
import { projectIdMap } from '../core/box';
import { fillBusyboxRootfs, busyboxVersion } from '../workers/bases/busyboxRootfs';
import { shiftTree } from '../workers/bases/idShift';
import type { ContainerSpec } from '../workers/drivers';
import { BoxNotRunningError } from '../workers/errors';
import { applyResourceParts, resourceParts, runcUpdateArgs } from '../workers/runtime/limits';
import { BOX_CHILD_OOM_SCORE_ADJ, BOX_OOM_SCORE_ADJ, buildOciSpec, DEFAULT_CAPABILITIES } from '../workers/runtime/ociSpec';
import { EXEC_OUTPUT_CAP_BYTES, ExecInputError, renderBoxesEnv, RuncRuntime } from '../workers/runtime/runc';
import { claimDir } from './helpers/owner';

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const hostTag = crypto.randomBytes(3).toString('hex');
const dataDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-runc-test-${hostTag}-`));
const runcRun: number[] = [];
const runtime = new RuncRuntime({
  dataDir,
  hostTag,
  logger: { debug: (o: { ms?: number }, msg?: string) => msg === 'runc run' && o.ms !== undefined && runcRun.push(o.ms), info: () => undefined, warn: () => undefined },
});
const netnsNames: string[] = [];
/** Everything a stream gives, as text, once it ends. */
const text = (s: Readable) =>
  new Promise<string>((resolve) => {
    const chunks: Buffer[] = [];
    s.on('data', (b: Buffer) => chunks.push(b));
    s.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
const boxIds: string[] = [];
/** The user namespace of every box here (a range no test host's project uses). */
const idMap = projectIdMap(250);

/** A box with a plain directory root (no ZFS) shifted into `idMap`, and an empty network
 *  namespace of its own (which the runtime replaces by one in the box's user namespace). */
async function makeBox(boxId: string, extra: Partial<ContainerSpec> = {}): Promise<ContainerSpec> {
  const rootfs = path.join(dataDir, 'roots', boxId);
  if (!fs.existsSync(rootfs)) {
    fs.mkdirSync(rootfs, { recursive: true });
    await fillBusyboxRootfs(rootfs);
    await shiftTree(rootfs, idMap);
  }
  const ns = `bh${hostTag}-${boxId}`;
  if (!fs.existsSync(`/run/netns/${ns}`)) {
    await run(['ip', 'netns', 'add', ns]);
    netnsNames.push(ns);
  }
  if (!boxIds.includes(boxId)) boxIds.push(boxId);
  return {
    boxId,
    hostname: `host-${boxId}`,
    rootfs,
    netnsPath: `/run/netns/${ns}`,
    cpus: 1,
    ramMb: 64,
    environment: { GREETING: "it's a box", EMPTY: '' },
    mounts: [],
    idMap,
    ...extra,
  };
}

t.teardown(async () => {
  for (const id of boxIds) await runtime.remove(id).catch(() => undefined);
  for (const ns of netnsNames) await run(['ip', 'netns', 'delete', ns], { allowFailure: true });
  fs.rmSync(dataDir, { recursive: true, force: true });
});

t.test('busybox rootfs and base version', async (t) => {
  const dir = path.join(dataDir, 'rootfs-check');
  fs.mkdirSync(dir);
  await fillBusyboxRootfs(dir);
  t.ok(fs.statSync(path.join(dir, 'bin/busybox')).isFile());
  t.equal(fs.readlinkSync(path.join(dir, 'bin/sh')), 'busybox');
  t.equal(fs.readlinkSync(path.join(dir, 'usr/bin/wget')), '../../bin/busybox');
  t.match(fs.readFileSync(path.join(dir, 'etc/passwd'), 'utf8'), /^box:x:1000:1000:[^:]*:\/home\/box:/m);
  t.match(fs.readFileSync(path.join(dir, 'etc/passwd'), 'utf8'), /^nobody:x:65534:65534:/m);
  t.equal(fs.statSync(path.join(dir, 'tmp')).mode & 0o7777, 0o1777);
  t.equal(fs.statSync(path.join(dir, 'home/box')).uid, 1000);
  for (const d of ['root', 'proc', 'sys', 'dev', 'run', 'etc/boxes']) t.ok(fs.statSync(path.join(dir, d)).isDirectory(), d);
  t.match(await busyboxVersion(), /^[0-9a-f]{12}$/);
  fs.rmSync(dir, { recursive: true });
});

t.test('OCI spec', async (t) => {
  const input = {
    rootfs: '/r', hostname: 'h1', netnsPath: '/run/netns/x', cgroupsPath: '/bhx-y', cpus: 1.5, ramMb: 100,
    environment: { A: 'b' }, mounts: [{ source: '/data/v', destination: '/data', readOnly: true }],
    init: { kind: 'boxd' as const, path: '/opt/boxd' }, busyboxPath: '/usr/bin/busybox', nofileHard: 20000,
  };
  const spec = buildOciSpec(input) as any;
  t.same(spec.process.capabilities.bounding, DEFAULT_CAPABILITIES);
  for (const cap of ['CAP_NET_RAW', 'CAP_MKNOD', 'CAP_AUDIT_WRITE']) t.notOk(DEFAULT_CAPABILITIES.includes(cap), `${cap} dropped`);
  t.equal(spec.process.noNewPrivileges, true);
  t.same(spec.process.rlimits, [{ type: 'RLIMIT_NOFILE', hard: 20000, soft: 20000 }, { type: 'RLIMIT_CORE', hard: 0, soft: 0 }], 'no core files');
  t.equal(spec.process.oomScoreAdj, BOX_OOM_SCORE_ADJ);
  t.notOk(spec.linux.seccomp.syscalls.some((s: any) => s.action === 'SCMP_ACT_ALLOW' && s.names.some((n: string) => n.startsWith('io_uring'))), 'io_uring is not allowed');
  t.notOk(spec.linux.namespaces.some((n: any) => n.type === 'user'), 'no user namespace without an id map');
  t.same(spec.linux.sysctl, { 'net.ipv4.ping_group_range': '0 2147483647' });
  const inUserns = buildOciSpec({ ...input, idMap: { hostId: 1_065_536, size: 65536 }, usernsPath: '/run/boxhost/userns/x' }) as any;
  t.same(inUserns.linux.namespaces[0], { type: 'user', path: '/run/boxhost/userns/x' }, 'the box joins its user namespace first');
  t.same(inUserns.linux.uidMappings, [{ containerID: 0, hostID: 1_065_536, size: 65536 }]);
  t.same(inUserns.linux.gidMappings, inUserns.linux.uidMappings);
  t.same(inUserns.linux.sysctl, { 'net.ipv4.ping_group_range': '0 65535' }, 'every group the namespace maps may ping');
  t.throws(() => buildOciSpec({ ...input, idMap: { hostId: 0, size: 65536 } }), /invalid id map/);
  t.equal(spec.linux.resources.memory.limit, 100 * 1024 * 1024);
  t.equal(spec.linux.resources.memory.swap, 100 * 1024 * 1024);
  t.same(spec.linux.resources.cpu, { quota: 150000, period: 100000 });
  t.same(spec.linux.namespaces.find((n: any) => n.type === 'network'), { type: 'network', path: '/run/netns/x' });
  t.ok(spec.process.env.includes('A=b'));
  t.same(spec.process.args, ['/.boxhost/boxd'], 'boxd is PID 1');
  t.same(spec.mounts.find((m: any) => m.destination === '/.boxhost/boxd'), { destination: '/.boxhost/boxd', type: 'bind', source: '/opt/boxd', options: ['bind', 'ro', 'nosuid', 'nodev'] }, 'bound read-only');
  t.ok(spec.mounts.find((m: any) => m.destination === '/data' && m.options.includes('ro')));
  t.ok(spec.mounts.find((m: any) => m.destination === '/sys' && m.options.includes('ro')));
  t.ok(spec.linux.maskedPaths.includes('/proc/kcore'));
  t.equal(spec.linux.seccomp.defaultAction, 'SCMP_ACT_ERRNO');
  t.throws(() => buildOciSpec({ ...input, hostname: 'bad host' }));
  t.throws(() => buildOciSpec({ ...input, environment: { 'A=B': 'x' } }));
  t.throws(() => buildOciSpec({ ...input, mounts: [{ source: '/x', destination: '/a/../etc', readOnly: false }] }));
});

t.test('limits: the spec builder and a live update get the same numbers', async (t) => {
  const input = {
    rootfs: '/r', hostname: 'h1', netnsPath: '/run/netns/x', cgroupsPath: '/bhx-y', cpus: 1, ramMb: 64,
    environment: {}, mounts: [], init: { kind: 'boxd' as const, path: '/opt/boxd' }, busyboxPath: '/usr/bin/busybox',
  };
  for (const swap of [true, false]) {
    for (const limits of [{ cpus: 1.5, ramMb: 100 }, { cpus: 0, ramMb: 4 }, { cpus: 0.001, ramMb: 256.7 }]) {
      const what = `${JSON.stringify(limits)}, swap accounted: ${swap}`;
      const spec = (buildOciSpec({ ...input, ...limits, memorySwap: swap }) as any).linux.resources;
      const parts = resourceParts(limits, swap);
      const args = runcUpdateArgs(parts);
      const arg = (name: string) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : undefined);
      t.equal(arg('--memory'), spec.memory.limit, `memory: ${what}`);
      t.equal(arg('--memory-swap'), spec.memory.swap, `memory+swap: ${what}`);
      t.equal(swap, 'swap' in spec.memory, `swap only when accounted: ${what}`);
      t.equal(arg('--cpu-quota'), spec.cpu?.quota ?? -1, `cpu quota: ${what}`);
      t.equal(arg('--cpu-period'), spec.cpu?.period ?? 100000, `cpu period: ${what}`);
      // update's bundle rewrite: a config started with other limits ends up as the spec.
      const old = (buildOciSpec({ ...input, cpus: 3, ramMb: 999, memorySwap: swap }) as any).linux.resources;
      applyResourceParts(old, parts);
      t.same(old, spec, `bundle rewrite: ${what}`);
    }
  }
  t.same(runcUpdateArgs(resourceParts({}, true)), [], 'nothing asked, nothing changed');
  t.throws(() => resourceParts({ ramMb: 3 }, true), RangeError);
});

t.test('a box runs', async (t) => {
  const spec = await makeBox('alpha');
  const starts: number[] = [];
  const t0 = Date.now();
  await runtime.start(spec);
  starts.push(Date.now() - t0);
  t.equal(await runtime.status('alpha'), 'running');
  const pid1 = JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId('alpha')])).stdout).pid;
  await runtime.start(spec); // idempotent: left alone
  const pid2 = JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId('alpha')])).stdout).pid;
  t.equal(pid2, pid1, 'a running box is left alone');
  t.same(await runtime.list(), [{ boxId: 'alpha', status: 'running' }]);

  const ex = async (command: string[], opts = {}) => runtime.exec('alpha', { command, ...opts });

  t.test('hostname', async (t) => {
    t.equal((await ex(['hostname'])).stdout, 'host-alpha\n');
    t.equal((await ex(['cat', '/etc/hostname'])).stdout, 'host-alpha\n');
  });

  t.test('ps shows only the box', async (t) => {
    const out = (await ex(['ps', '-o', 'pid,args'])).stdout.trim().split('\n').slice(1);
    t.match(out[0], /^\s*1 \/\.boxhost\/boxd$/, 'boxd is PID 1');
    t.ok(out.length <= 2, `few processes: ${out.join(' | ')}`);
    t.ok(out.every((l) => /boxd|ps -o/.test(l)), out.join(' | '));
  });

  t.test('isolation', async (t) => {
    const mnt = await ex(['mount', '-t', 'tmpfs', 'none', '/mnt']);
    t.not(mnt.exitCode, 0, 'mount fails');
    const mnt2 = await ex(['mount', '--bind', '/tmp', '/mnt']);
    t.not(mnt2.exitCode, 0, 'bind mount fails');
    const sys = await ex(['sh', '-c', 'echo 1 > /sys/kernel/uevent_helper']);
    t.not(sys.exitCode, 0, 'writing /sys fails');
    t.match(sys.stderr, /Read-only file system/);
    t.not((await ex(['mkdir', '/sys/fs/cgroup/memory/x'])).exitCode, 0, 'cgroupfs read-only');
    t.not((await ex(['sh', '-c', 'echo 1 > /proc/sys/kernel/ns_last_pid'])).exitCode, 0, '/proc/sys read-only');
    t.equal((await ex(['cat', '/proc/kcore'])).stdout, '', '/proc/kcore masked');
    const status = (await ex(['cat', '/proc/self/status'])).stdout;
    t.match(status, /^NoNewPrivs:\s+1$/m);
    t.match(status, /^Seccomp:\s+2$/m);
    t.match(status, /^CapEff:\s+00000000800405fb$/m, "Docker's default capabilities without NET_RAW, MKNOD, AUDIT_WRITE");
    t.not((await ex(['unshare', '-n', 'true'])).exitCode, 0, 'unshare fails');
    t.not((await ex(['hostname', 'other'])).exitCode, 0, 'sethostname fails');
    t.equal((await ex(['hostname'])).stdout, 'host-alpha\n');
    const mknod = await ex(['mknod', '/tmp/null2', 'c', '1', '3']);
    t.not(mknod.exitCode, 0, 'mknod fails');
    t.notOk(fs.existsSync(path.join(spec.rootfs, 'tmp/null2')));
    t.match((await ex(['arping', '-c', '1', '-w', '1', '-I', 'lo', '127.0.0.1'])).stderr, /not permitted/, 'a raw (packet) socket fails');
    t.equal((await ex(['cat', '/proc/sys/net/ipv4/ping_group_range'])).stdout, '0\t65535\n', 'ICMP datagram sockets for every box group');
    t.equal((await ex(['sh', '-c', 'ulimit -c'])).stdout, '0\n', 'no core files');
    t.match((await ex(['cat', '/proc/self/limits'])).stdout, /^Max core file size\s+0\s+0\s/m, 'hard limit too: the box cannot raise it');
  });

  t.test('user namespace: root in the box is an unprivileged host user', async (t) => {
    t.equal((await ex(['id', '-u'])).stdout, '0\n');
    t.equal((await ex(['cat', '/proc/self/uid_map'])).stdout.trim().split(/\s+/).join(' '), `0 ${idMap.hostId} ${idMap.size}`);
    t.equal((await ex(['cat', '/proc/self/gid_map'])).stdout.trim().split(/\s+/).join(' '), `0 ${idMap.hostId} ${idMap.size}`);
    t.equal(fs.readFileSync(`/proc/${pid1}/status`, 'utf8').match(/^Uid:\s+(\d+)/m)?.[1], String(idMap.hostId), 'PID 1 runs as the range\'s first host id');
    await ex(['sh', '-c', 'echo mine > /tmp/by-root']);
    await ex(['sh', '-c', 'echo mine > /tmp/by-box'], { user: 'box' });
    const byRoot = fs.statSync(path.join(spec.rootfs, 'tmp/by-root'));
    const byBox = fs.statSync(path.join(spec.rootfs, 'tmp/by-box'));
    t.same([byRoot.uid, byRoot.gid], [idMap.hostId, idMap.hostId], 'a file root writes is owned by the range on the host');
    t.same([byBox.uid, byBox.gid], [idMap.hostId + 1000, idMap.hostId + 1000], "and a user's by its id in the range");
    t.equal((await ex(['id', '-u'], { user: '1234:1234' })).stdout, '1234\n', '--user takes box ids');
    await t.rejects(ex(['id'], { user: '70000:70000' }), ExecInputError, 'an id past the range is refused');
    t.equal(fs.readFileSync(`/proc/${pid1}/oom_score_adj`, 'utf8').trim(), String(BOX_OOM_SCORE_ADJ), "PID 1's OOM score");
    // boxd raises a process just after it starts (boxd/reaper.go): read a moment later, by a child of it.
    const score = ['sh', '-c', 'sleep 0.3; cat /proc/self/oom_score_adj'];
    t.equal((await ex(score)).stdout.trim(), String(BOX_CHILD_OOM_SCORE_ADJ), "an exec'd process's OOM score: above PID 1's, so a box short of memory loses it, not boxd");
    t.equal((await ex(score, { user: 'box' })).stdout.trim(), String(BOX_CHILD_OOM_SCORE_ADJ), "a box user's process's too");
  });

  t.test('/etc/boxes-env and environment', async (t) => {
    const env = (await ex(['cat', '/etc/boxes-env'])).stdout;
    t.equal(env, "EMPTY=''\nGREETING='it'\\''s a box'\n");
    t.equal(env, renderBoxesEnv(spec.environment));
    const sourced = await ex(['sh', '-c', 'unset GREETING; . /etc/boxes-env; echo "$GREETING"']);
    t.equal(sourced.stdout, "it's a box\n");
    t.equal((await ex(['sh', '-c', 'echo "$GREETING"'])).stdout, "it's a box\n", 'in the process env too');
  });

  t.test('exec basics', async (t) => {
    const r = await ex(['sh', '-c', 'echo out; echo err >&2; exit 3']);
    t.equal(r.exitCode, 3);
    t.equal(r.stdout, 'out\n');
    t.equal(r.stderr, 'err\n');
    t.equal(r.detached, false);
    t.ok(r.pid > 0);
    t.equal((await ex(['true'])).exitCode, 0);
    t.equal((await ex(['false'])).exitCode, 1);
    const nf = await ex(['no-such-command']);
    t.equal(nf.exitCode, 127);
    t.match(nf.stderr, /not found/);
    t.equal((await ex(['/no/such/path'])).exitCode, 127);
    t.equal((await ex(['sh', '-c', 'kill -9 $$'])).exitCode, 137, 'killed by a signal: 128+n');
    const e = await ex(['sh', '-c', 'echo "$FOO|$GREETING|$HOME"'], { env: { FOO: 'a b$c', GREETING: 'over' } });
    t.equal(e.stdout, 'a b$c|over|/root\n');
    t.equal((await ex(['pwd'])).stdout, '/\n');
    t.equal((await ex(['pwd'], { cwd: '/tmp' })).stdout, '/tmp\n');
    t.equal((await ex(['cat'], { stdin: Buffer.from('piped\ninput') })).stdout, 'piped\ninput');
    const dev = await ex(['sh', '-c', 'echo to-err > /dev/stderr; echo to-out > /dev/stdout; cat'], { stdin: Buffer.from('in') });
    t.same([dev.stdout, dev.stderr], ['to-out\nin', 'to-err\n'], '/dev/stdout and /dev/stderr can be opened');
    t.equal((await ex(['sh', '-c', 'read x || echo eof'])).stdout, 'eof\n', 'no stdin: end of file at once');
    const args = ['a b', '', "q'uote", '$(echo no)', '*'];
    t.equal((await ex(['sh', '-c', 'for a in "$@"; do echo "[$a]"; done', 'sh', ...args])).stdout, args.map((a) => `[${a}]\n`).join(''));
    await t.rejects(ex(['pwd'], { cwd: '/no/such/dir' }), ExecInputError);
    await t.rejects(ex(['pwd'], { cwd: 'tmp' }), ExecInputError);
    await t.rejects(ex([]), ExecInputError);
    await t.rejects(runtime.exec('nosuchbox', { command: ['true'] }), /not running/);
  });

  t.test('exec users', async (t) => {
    const box = await ex(['sh', '-c', 'id -u; id -g; echo $HOME; pwd'], { user: 'box', cwd: '/home/box' });
    t.equal(box.stdout, '1000\n1000\n/home/box\n/home/box\n');
    t.equal((await ex(['id', '-u'], { user: '65534' })).stdout, '65534\n');
    t.equal((await ex(['id', '-g'], { user: 'nobody' })).stdout, '65534\n');
    t.equal((await ex(['id', '-u'], { user: '1234:1234' })).stdout, '1234\n');
    t.equal((await ex(['id', '-G'], { user: 'box:daemon' })).stdout, '1\n');
    await t.rejects(ex(['id'], { user: 'nosuchuser' }), ExecInputError);
    await t.rejects(ex(['id'], { user: 'a:b:c' }), ExecInputError);
    const denied = await ex(['sh', '-c', 'echo x > /root/f'], { user: 'box' });
    t.not(denied.exitCode, 0, 'a normal user cannot write /root');
    await t.rejects(ex(['true'], { user: 'box', cwd: '/root' }), ExecInputError, 'a cwd the user cannot enter');
  });

  t.test('exec user lookup never leaves the box', async (t) => {
    // A box whose /etc/passwd is a symlink to the host's: resolved inside the box, it points
    // at the box's own file, never the host's.
    const root = spec.rootfs;
    const hostPasswd = path.join(dataDir, 'host-passwd');
    fs.writeFileSync(hostPasswd, 'evil:x:4242:4242::/:/bin/sh\n');
    fs.renameSync(path.join(root, 'etc/passwd'), path.join(root, 'etc/passwd.real'));
    fs.symlinkSync(hostPasswd, path.join(root, 'etc/passwd'));
    try {
      await t.rejects(ex(['id'], { user: 'evil' }), ExecInputError);
    } finally {
      fs.unlinkSync(path.join(root, 'etc/passwd'));
      fs.renameSync(path.join(root, 'etc/passwd.real'), path.join(root, 'etc/passwd'));
    }
    t.equal((await ex(['id', '-u'], { user: 'box' })).stdout, '1000\n');
  });

  t.test('exec tty', async (t) => {
    const r = await ex(['sh', '-c', 'tty; echo out; echo err >&2; exit 4'], { tty: true });
    t.equal(r.exitCode, 4);
    t.match(r.stdout, /^\/dev\/pts\/\d+\r\nout\r\nerr\r\n$/);
    t.equal(r.stderr, '');
    t.equal((await ex(['stty', 'size'], { tty: true })).stdout, '24 80\r\n');
    const cat = await ex(['cat'], { tty: true, stdin: Buffer.from('one\ntwo\n') });
    t.equal(cat.exitCode, 0, 'EOF reaches the process');
    t.equal(cat.stdout, 'one\r\ntwo\r\n', 'input is not echoed; output has CRLF');
    const many = await Promise.all([1, 2, 3, 4, 5, 6].map((i) => ex(['sh', '-c', `echo ${i}; echo e${i} >&2`], { tty: true })));
    t.same(many.map((r) => r.stdout), [1, 2, 3, 4, 5, 6].map((i) => `${i}\r\ne${i}\r\n`), 'the same bytes every time, even concurrently');
    t.equal((await ex(['true'], { tty: true, user: 'box', cwd: '/home/box' })).exitCode, 0);
    await t.rejects(ex(['true'], { tty: true, cwd: '/nope' }), ExecInputError);
  });

  t.test('exec detach', async (t) => {
    const t0 = Date.now();
    const r = await ex(['sleep', '300'], { detach: true });
    t.ok(Date.now() - t0 < 10_000, `answers at once, not after the process (${Date.now() - t0} ms)`);
    t.equal(r.exitCode, -1);
    t.equal(r.detached, true);
    t.ok(r.pid > 1);
    t.equal((await ex(['cat', `/proc/${r.pid}/cmdline`])).stdout, 'sleep\x00300\x00', 'the pid is the process\'s in the box');
    const ps = (await ex(['ps', '-o', 'pid,ppid,args'])).stdout;
    t.match(ps, new RegExp(`^\\s*${r.pid}\\s+1\\s+sleep 300$`, 'm'), 'a child of the box init');
    await t.rejects(ex(['sleep', '1'], { detach: true, cwd: '/nope' }), ExecInputError);
    const d2 = await ex(['sh', '-c', 'echo hi > /tmp/detached-out'], { detach: true, cwd: '/tmp' });
    t.equal(d2.exitCode, -1);
    await new Promise((r) => setTimeout(r, 300));
    t.equal((await ex(['cat', '/tmp/detached-out'])).stdout, 'hi\n');
    t.equal((await ex(['kill', '-9', String(r.pid)])).exitCode, 0, 'killed from inside the box by that pid');
  });

  t.test('exec timeout', async (t) => {
    const t0 = Date.now();
    const r = await ex(['sh', '-c', 'echo started; sleep 30; echo never'], { timeoutMs: 500 });
    t.equal(r.exitCode, 124);
    t.equal(r.stdout, 'started\n');
    t.ok(Date.now() - t0 < 5000, `ended soon (${Date.now() - t0} ms)`);
    const ps = (await ex(['ps', '-o', 'args'])).stdout;
    t.notMatch(ps, /sleep 30$/m, 'the process and its children are gone');
    const tt = await ex(['sleep', '30'], { timeoutMs: 300, tty: true });
    t.equal(tt.exitCode, 124);
    t.notMatch((await ex(['ps', '-o', 'args'])).stdout, /sleep 30$/m);
  });

  t.test('exec output', async (t) => {
    const seq = await ex(['seq', '1', '200000']);
    let want = '';
    for (let i = 1; i <= 200000; i++) want += `${i}\n`;
    t.equal(seq.stdout.length, want.length);
    t.ok(seq.stdout === want, 'nothing lost under the cap');
    t.equal(seq.truncated, false);
    const t0 = Date.now();
    const big = await ex(['sh', '-c', `echo started >&2; head -c ${EXEC_OUTPUT_CAP_BYTES + 100000} /dev/zero | tr '\\0' x; sleep 30; echo never >&2`]);
    t.equal(big.exitCode, 137, 'killed once past the cap');
    t.ok(Date.now() - t0 < 20_000, `it did not run on (${Date.now() - t0} ms)`);
    t.equal(big.stdout.length, EXEC_OUTPUT_CAP_BYTES);
    t.equal(big.truncated, true);
    t.equal(big.stderr, 'started\n');
    t.notMatch((await ex(['ps', '-o', 'args'])).stdout, /sleep 30$/m, 'its children are gone too');
    const bg = await ex(['sh', '-c', 'sleep 20 & echo fg']);
    t.equal(bg.stdout, 'fg\n', 'a background child holding stdout does not hold the answer');
  });

  t.test('execStream', async (t) => {
    const stream = (command: string[], opts = {}) => runtime.execStream('alpha', { command, ...opts });

    t.test('stdout flows while the process runs', async (t) => {
      const p = await stream(['sh', '-c', 'echo a; sleep 1; echo b']);
      let exited = false;
      void p.exited.then(() => (exited = true));
      const chunks: { at: number; text: string; running: boolean }[] = [];
      p.stdout.on('data', (b: Buffer) => chunks.push({ at: Date.now(), text: b.toString(), running: !exited }));
      const err = text(p.stderr);
      t.same(await p.exited, { exitCode: 0, timedOut: false });
      t.equal(chunks.map((c) => c.text).join(''), 'a\nb\n');
      t.equal(chunks[0].text, 'a\n');
      t.ok(chunks[0].running, 'the first line came while the process still ran');
      t.ok(chunks[chunks.length - 1].at - chunks[0].at >= 800, 'a second before the last');
      t.equal(await err, '');
      t.ok((await p.pid()) > 0);
    });

    t.test('stdin in chunks, then EOF', async (t) => {
      const p = await stream(['cat'], { stdin: true });
      const out: Buffer[] = [];
      const echoed = new Promise<void>((resolve) =>
        p.stdout.on('data', (b: Buffer) => {
          out.push(b);
          if (Buffer.concat(out).toString() === 'ping\n') resolve();
        }),
      );
      p.stdin!.write('ping\n');
      await echoed; // a round trip while stdin is still open
      for (const c of ['one ', 'two\n', 'three']) {
        p.stdin!.write(c);
        await sleep(30);
      }
      p.stdin!.end();
      t.same(await p.exited, { exitCode: 0, timedOut: false }, 'EOF reached cat');
      t.equal(Buffer.concat(out).toString(), 'ping\none two\nthree');
    });

    t.test('tty: resize, typed input', async (t) => {
      const p = await stream(['sh', '-c', 'sleep 0.5; stty size'], { tty: true });
      const out = text(p.stdout);
      await p.resize(100, 40);
      t.same(await p.exited, { exitCode: 0, timedOut: false });
      t.equal(await out, '40 100\r\n', 'the box sees the size set');
      const cat = await stream(['cat'], { tty: true, stdin: true });
      const catOut = text(cat.stdout);
      cat.stdin!.write('hi');
      cat.stdin!.write(' there\n');
      cat.stdin!.end(); // ^D
      t.same(await cat.exited, { exitCode: 0, timedOut: false });
      t.equal(await catOut, 'hi there\r\n');
      const plain = await stream(['true']);
      await plain.resize(100, 40); // no tty: nothing to do
      t.equal((await plain.exited).exitCode, 0);
    });

    t.test('signal', async (t) => {
      const p = await stream(['sleep', '100']);
      t.ok((await p.pid()) > 0);
      p.signal('SIGTERM');
      t.same(await p.exited, { exitCode: 143, timedOut: false });
      const tty = await stream(['sleep', '100'], { tty: true });
      tty.signal('SIGTERM');
      t.same(await tty.exited, { exitCode: 143, timedOut: false }, 'a tty process too');
    });

    t.test('timeout', async (t) => {
      const t0 = Date.now();
      const p = await stream(['sh', '-c', 'echo started; sleep 30'], { timeoutMs: 300 });
      const out = text(p.stdout);
      t.same(await p.exited, { exitCode: 124, timedOut: true });
      t.equal(await out, 'started\n');
      t.ok(Date.now() - t0 < 5000);
    });

    t.test('errors', async (t) => {
      await t.rejects((await stream(['pwd'], { cwd: '/no/such/dir' })).exited, ExecInputError);
      await t.rejects((await stream(['pwd'], { cwd: '/no/such/dir', tty: true })).exited, ExecInputError);
      await t.rejects(stream(['pwd'], { cwd: 'relative' }), ExecInputError);
      await t.rejects((await runtime.execStream('nosuchbox', { command: ['true'] })).exited, BoxNotRunningError);
    });

    t.test('back-pressure: a paused reader holds the writer', async (t) => {
      const size = 50 * 1024 * 1024;
      const rss0 = process.memoryUsage().rss;
      const p = await stream(['head', '-c', String(size), '/dev/zero']);
      let exited = false;
      void p.exited.then(() => (exited = true));
      p.stdout.pause();
      await sleep(1000);
      const grown = process.memoryUsage().rss - rss0;
      t.ok(grown < 64 * 1024 * 1024, `rss grew ${(grown / 1048576).toFixed(1)} MB`);
      t.notOk(exited, 'the writer waits for the reader');
      let n = 0;
      p.stdout.on('data', (b: Buffer) => (n += b.length));
      p.stdout.resume();
      t.same(await p.exited, { exitCode: 0, timedOut: false });
      await new Promise((resolve) => (p.stdout.readableEnded ? resolve(undefined) : p.stdout.once('end', resolve)));
      t.equal(n, size, 'every byte');
    });
  });

  t.test('exec cwd never reaches the host (CVE-2024-21626 class)', async (t) => {
    const marker = `boxhost-host-marker-${crypto.randomBytes(4).toString('hex')}`;
    const hostDir = fs.mkdtempSync(path.join(dataDir, 'hostcwd-'));
    for (const d of [hostDir, dataDir, runtime.root, runtime.bundlePath('alpha'), path.join(dataDir, 'exec')]) {
      fs.mkdirSync(d, { recursive: true });
      fs.writeFileSync(path.join(d, marker), 'host');
    }
    const oldCwd = process.cwd();
    process.chdir(hostDir);
    // A symlink in the box pointing at a leaked fd, too.
    fs.symlinkSync('/proc/self/fd/7', path.join(spec.rootfs, 'tmp/esc'));
    try {
      const cwds = [...Array.from({ length: 18 }, (_, i) => `/proc/self/fd/${i + 3}`), '/tmp/esc', '/proc/self/cwd', '/proc/1/cwd/../..'];
      for (const cwd of cwds) {
        let listing = '';
        try {
          const r = await ex(['ls', '-a', '.'], { cwd });
          listing = r.stdout + r.stderr;
        } catch (e) {
          t.type(e, ExecInputError, `${cwd}: refused`);
          continue;
        }
        t.notMatch(listing, marker, `${cwd}: no host directory`);
        t.notMatch(listing, /\bcpuacct\b|\bfreezer\b/, `${cwd}: not the host cgroupfs`);
      }
    } finally {
      process.chdir(oldCwd);
      fs.unlinkSync(path.join(spec.rootfs, 'tmp/esc'));
    }
  });

  t.test('box environment values never reach a host command line', async (t) => {
    const secret = `s3cret-${crypto.randomBytes(6).toString('hex')}`;
    await runtime.writeEnvironment('alpha', { BOX_SECRET: secret });
    const running = ex(['sh', '-c', 'sleep 1; echo "$BOX_SECRET $CALL_SECRET"'], { env: { CALL_SECRET: `${secret}-call` } });
    await sleep(400);
    const cmdlines: { pid: string; cmdline: string }[] = [];
    for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
      try {
        cmdlines.push({ pid, cmdline: fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ') });
      } catch {
        /* gone */
      }
    }
    t.same(cmdlines.filter((c) => c.cmdline.includes(' exec ') && c.cmdline.includes(runtime.containerId('alpha'))), [], 'no runc exec: boxd forks the process in the box');
    t.ok(cmdlines.some((c) => c.cmdline.startsWith('sleep 1')), 'the process was seen');
    t.same(cmdlines.filter((c) => c.cmdline.includes(secret)), [], 'no host command line holds a value');
    t.equal((await running).stdout, `${secret} ${secret}-call\n`, 'the process still has them');
    await runtime.writeEnvironment('alpha', spec.environment);
  });

  t.test('an aborted exec is killed, with its group: 137', async (t) => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    const t0 = Date.now();
    const r = await ex(['sh', '-c', 'echo started; sleep 30 & sleep 30; echo never'], { signal: ac.signal });
    t.equal(r.exitCode, 137);
    t.equal(r.stdout, 'started\n');
    t.ok(Date.now() - t0 < 5000, `ended soon (${Date.now() - t0} ms)`);
    t.notMatch((await ex(['ps', '-o', 'args'])).stdout, /sleep 30$/m, 'nothing it started runs on');
    const already = new AbortController();
    already.abort();
    t.equal((await ex(['sleep', '30'], { signal: already.signal })).exitCode, 137, 'aborted before it started');
  });

  t.test("PID 1 writes to no host file; runc's own log stays small", async (t) => {
    t.equal(fs.readlinkSync(`/proc/${pid1}/fd/1`), '/dev/null', "PID 1's stdout");
    t.equal(fs.readlinkSync(`/proc/${pid1}/fd/2`), '/dev/null', "PID 1's stderr");
    const sizes = () => Object.fromEntries(fs.readdirSync(runtime.bundlePath('alpha')).map((f) => [f, fs.statSync(path.join(runtime.bundlePath('alpha'), f)).size]));
    const before = sizes();
    const dd = await ex(['sh', '-c', 'dd if=/dev/zero of=/proc/1/fd/1 bs=1M count=50 2>&1; dd if=/dev/zero of=/proc/1/fd/2 bs=1M count=50 2>&1']);
    t.match(dd.stdout, /can't open '\/proc\/1\/fd\/1': Permission denied/, "boxd is not dumpable: its descriptors cannot be opened from the box, root's neither");
    t.same(sizes(), before, 'no file of the bundle grew');
  });

  t.test('writeEnvironment on a running box', async (t) => {
    await runtime.writeEnvironment('alpha', { NEWVAR: 'new value' });
    t.equal((await ex(['cat', '/etc/boxes-env'])).stdout, "NEWVAR='new value'\n");
    t.equal((await ex(['sh', '-c', 'echo "$NEWVAR"'])).stdout, 'new value\n', 'later execs see it');
  });

  t.test('memory limit: the hog dies, the box lives', async (t) => {
    const cg = `/sys/fs/cgroup/memory${runtime.cgroupsPath('alpha')}`;
    t.equal(fs.readFileSync(`${cg}/memory.limit_in_bytes`, 'utf8').trim(), String(64 * 1024 * 1024));
    const hog = await ex(['sh', '-c', 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo survived ${#x}']);
    t.equal(hog.exitCode, 137, 'killed by the OOM killer');
    t.notMatch(hog.stdout, /survived/);
    t.equal(await runtime.status('alpha'), 'running');
    t.equal((await ex(['echo', 'still here'])).stdout, 'still here\n');
  });

  t.test('update changes limits live', async (t) => {
    const cg = (c: string, f: string) => fs.readFileSync(`/sys/fs/cgroup/${c}${runtime.cgroupsPath('alpha')}/${f}`, 'utf8').trim();
    const bundled = () => JSON.parse(fs.readFileSync(path.join(runtime.bundlePath('alpha'), 'config.json'), 'utf8')).linux.resources;
    await runtime.update('alpha', { ramMb: 256 });
    t.equal(cg('memory', 'memory.limit_in_bytes'), String(256 * 1024 * 1024));
    t.equal(cg('memory', 'memory.memsw.limit_in_bytes'), String(256 * 1024 * 1024));
    t.equal(String(bundled().memory.limit), cg('memory', 'memory.limit_in_bytes'), 'config.json says what the cgroup has');
    t.equal(String(bundled().memory.swap), cg('memory', 'memory.memsw.limit_in_bytes'));
    const ok = await ex(['sh', '-c', 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}']);
    t.equal(ok.stdout, '100000000\n', '100 MB fits now');
    await runtime.update('alpha', { ramMb: 48, cpus: 0.5 });
    t.equal(cg('memory', 'memory.limit_in_bytes'), String(48 * 1024 * 1024));
    t.equal(cg('memory', 'memory.memsw.limit_in_bytes'), String(48 * 1024 * 1024));
    t.equal(cg('cpu', 'cpu.cfs_quota_us'), '50000');
    t.equal(cg('cpu', 'cpu.cfs_period_us'), '100000');
    t.same(bundled().cpu, { quota: Number(cg('cpu', 'cpu.cfs_quota_us')), period: Number(cg('cpu', 'cpu.cfs_period_us')) });
    t.equal(String(bundled().memory.limit), cg('memory', 'memory.limit_in_bytes'));
    t.equal(await runtime.status('alpha'), 'running');
  });

  t.test('zombies are reaped by boxd', async (t) => {
    await ex(['sh', '-c', '(sleep 0.2 &); true']);
    await ex(['sh', '-c', '(sh -c "sleep 0.1" &); exit 0']);
    await new Promise((r) => setTimeout(r, 800));
    const ps = (await ex(['ps', '-o', 'stat,ppid,args'])).stdout;
    t.notMatch(ps, /^\s*Z/m, `no zombie:\n${ps}`);
  });

  t.test('exec speed', async (t) => {
    const times: number[] = [];
    for (let i = 0; i < 15; i++) {
      const t0 = process.hrtime.bigint();
      await ex(['true']);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    t.comment(`exec median ${median(times).toFixed(1)} ms`);
    t.ok(median(times) < 1000);
  });

  t.test('stop honours SIGTERM, then everything is idempotent', async (t) => {
    await ex(['sleep', '1000'], { detach: true });
    const t0 = Date.now();
    await runtime.stop('alpha', 20);
    const took = Date.now() - t0;
    t.ok(took < 5000, `PID 1 ended on SIGTERM, well before the grace (${took} ms)`);
    t.equal(await runtime.status('alpha'), null);
    const leftovers = fs.readdirSync('/sys/fs/cgroup').filter((c) => fs.existsSync(`/sys/fs/cgroup/${c}${runtime.cgroupsPath('alpha')}`));
    t.same(leftovers, [], 'no cgroup directory left');
    await runtime.stop('alpha', 1);
    t.same(await runtime.list(), []);
    await runtime.start(spec);
    t.equal(await runtime.status('alpha'), 'running', 'starts again');
    await runtime.stop('alpha', 5);
    await runtime.remove('alpha');
    await runtime.remove('alpha');
    t.equal(await runtime.status('alpha'), null);
    t.notOk(fs.existsSync(runtime.bundlePath('alpha')));
    await t.rejects(runtime.exec('alpha', { command: ['true'] }));
  });

  t.test('start time', async (t) => {
    for (let i = 0; i < 7; i++) {
      await runtime.stop('alpha', 5);
      const t0 = Date.now();
      await runtime.start(spec);
      starts.push(Date.now() - t0);
    }
    t.comment(`start() median ${median(starts)} ms; runc run -d alone median ${median(runcRun)} ms`);
    await runtime.remove('alpha');
  });
});

t.test('/etc/hostname and /etc/boxes-env come from the bundle; the box root is never written', async (t) => {
  const spec = await makeBox('beta');
  const hostFile = path.join(dataDir, 'host-secret');
  fs.writeFileSync(hostFile, 'untouched');
  // A hostile root: its /etc/boxes-env points at a host file.
  fs.symlinkSync(hostFile, path.join(spec.rootfs, 'etc/boxes-env'));
  await runtime.start(spec);
  const inBox = (command: string[]) => runtime.exec('beta', { command });
  t.equal(fs.readFileSync(hostFile, 'utf8'), 'untouched', 'the host file behind the symlink is untouched');
  t.equal((await inBox(['cat', '/etc/boxes-env'])).stdout, fs.readFileSync(path.join(runtime.bundlePath('beta'), 'boxes-env'), 'utf8'));
  t.equal((await inBox(['cat', '/etc/hostname'])).stdout, `${spec.hostname}\n`);
  t.not((await inBox(['sh', '-c', 'echo x > /etc/boxes-env'])).exitCode, 0, 'read-only in the box');
  await runtime.writeEnvironment('beta', { X: '1' });
  t.equal((await inBox(['cat', '/etc/boxes-env'])).stdout, "X='1'\n", 'a running box sees a rewrite at once');
  await runtime.stop('beta', 5);
  t.ok(fs.lstatSync(path.join(spec.rootfs, 'etc/boxes-env')).isSymbolicLink(), 'the root was not written');
  // A root whose /etc is a symlink out of the box: runc resolves the mount inside the root.
  fs.renameSync(path.join(spec.rootfs, 'etc'), path.join(spec.rootfs, 'etc.real'));
  fs.symlinkSync(dataDir, path.join(spec.rootfs, 'etc'));
  await runtime.start(spec);
  t.notOk(fs.existsSync(path.join(dataDir, 'boxes-env')), 'nothing lands in the host directory');
  t.notOk(fs.existsSync(path.join(dataDir, 'hostname')));
  t.equal((await inBox(['cat', '/etc/hostname'])).stdout, `${spec.hostname}\n`);
  await runtime.remove('beta');
  fs.unlinkSync(path.join(spec.rootfs, 'etc'));
  fs.renameSync(path.join(spec.rootfs, 'etc.real'), path.join(spec.rootfs, 'etc'));
});

t.test("the bundle is the host root's: the box's user cannot plant a symlink for the node to write through, another project's cannot read it", async (t) => {
  const spec = await makeBox('gamma', { environment: { SECRET: 'gamma-only' } });
  await runtime.start(spec);
  const bundle = runtime.bundlePath('gamma');
  const st = fs.statSync(bundle);
  t.same([st.uid, st.gid, st.mode & 0o777], [0, idMap.hostId, 0o750], 'root:<range> 0750');
  const hostFile = path.join(dataDir, 'root-only');
  fs.writeFileSync(hostFile, 'untouched', { mode: 0o600 });
  // As an escape from the box would be: the range's first host id, on the host.
  const as = (uid: number, script: string) => run(['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', 'sh', '-c', script], { allowFailure: true });
  t.equal((await as(idMap.hostId, `cat ${bundle}/boxes-env`)).stdout, "SECRET='gamma-only'\n", 'positive control: the box\'s own user reads its bundle');
  const plant = await as(idMap.hostId, `rm -f ${bundle}/boxes-env; ln -sf ${hostFile} ${bundle}/planted`);
  t.not(plant.exitCode, 0, 'it cannot remove or add entries');
  t.notOk(fs.existsSync(path.join(bundle, 'planted')));
  const other = projectIdMap(251).hostId;
  const peek = await as(other, `cat ${bundle}/boxes-env`);
  t.not(peek.exitCode, 0, "another project's user cannot read it");
  t.match(peek.stderr, /Permission denied/);
  await runtime.stop('gamma', 5);
  // A symlink left in the bundle by a version that gave the bundle to the box's user.
  fs.rmSync(path.join(bundle, 'boxes-env'));
  fs.symlinkSync(hostFile, path.join(bundle, 'boxes-env'));
  fs.rmSync(path.join(bundle, 'hostname'));
  fs.symlinkSync(hostFile, path.join(bundle, 'hostname'));
  await runtime.start(spec);
  t.equal(fs.readFileSync(hostFile, 'utf8'), 'untouched', 'the start wrote no file through the symlinks');
  t.notOk(fs.lstatSync(path.join(bundle, 'boxes-env')).isSymbolicLink());
  t.equal((await runtime.exec('gamma', { command: ['cat', '/etc/hostname'] })).stdout, 'host-gamma\n');
  fs.rmSync(path.join(bundle, 'boxes-env'));
  fs.symlinkSync(hostFile, path.join(bundle, 'boxes-env'));
  await runtime.writeEnvironment('gamma', { X: '1' });
  t.equal(fs.readFileSync(hostFile, 'utf8'), 'untouched', 'nor did a rewrite of the environment');
  t.equal(fs.readFileSync(path.join(bundle, 'boxes-env'), 'utf8'), "X='1'\n");
  await runtime.remove('gamma');
});

t.test('data volume mounts', async (t) => {
  const vol = path.join(dataDir, 'vol');
  fs.mkdirSync(vol);
  fs.writeFileSync(path.join(vol, 'f'), 'volume data');
  // A volume is written by root in the box only when it is owned in the box's id range.
  fs.chownSync(vol, idMap.hostId, idMap.hostId);
  const spec = await makeBox('gamma', {
    mounts: [
      { source: vol, destination: '/data', readOnly: false },
      { source: vol, destination: '/ro', readOnly: true },
    ],
  });
  await runtime.start(spec);
  t.equal((await runtime.exec('gamma', { command: ['cat', '/data/f'] })).stdout, 'volume data');
  t.equal((await runtime.exec('gamma', { command: ['sh', '-c', 'echo w > /data/g'] })).exitCode, 0);
  t.equal(fs.readFileSync(path.join(vol, 'g'), 'utf8'), 'w\n');
  t.not((await runtime.exec('gamma', { command: ['sh', '-c', 'echo w > /ro/h'] })).exitCode, 0, 'read-only mount');
  await runtime.remove('gamma');
});

t.test('a box whose processes ignore SIGTERM, even stopped, is killed at the end of its grace', async (t) => {
  const spec = await makeBox('delta');
  await runtime.start(spec);
  const pid1 = JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId('delta')])).stdout).pid;
  await runtime.exec('delta', { command: ['sh', '-c', 'trap "" TERM; exec sleep 1000'], detach: true });
  let child = 0;
  // boxd has several threads; a child is listed under the one that forked it.
  const children = () => fs.readdirSync(`/proc/${pid1}/task`).flatMap((tid) => fs.readFileSync(`/proc/${pid1}/task/${tid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number));
  for (let i = 0; i < 100 && !child; i++, await sleep(10)) child = children()[0] ?? 0;
  t.ok(child > 0, "boxd's child, which ignores SIGTERM");
  if (!(child > 0)) return; // never signal pid 0: that is this test's own process group
  process.kill(child, 'SIGSTOP');
  await sleep(100);
  t.match(fs.readFileSync(`/proc/${child}/stat`, 'utf8'), /\) T /, 'it is stopped');
  const t0 = Date.now();
  await runtime.stop('delta', 2);
  const took = Date.now() - t0;
  t.ok(took >= 1900 && took < 4000, `gone within grace + 2 s (${took} ms)`);
  t.equal(await runtime.status('delta'), null);
  t.notOk(fs.existsSync(`/proc/${child}`), 'the stopped process is gone');
  await runtime.remove('delta');
});

t.test("a start that fails says why, from runc's log", async (t) => {
  const spec = await makeBox('epsilon', { rootfs: path.join(dataDir, 'roots', 'no-such-root') });
  const err = await runtime.start(spec).then(
    () => null,
    (e: Error) => e,
  );
  t.ok(err, 'the start failed');
  t.match(err?.message, /no such file or directory|rootfs/i, "runc's reason");
  const log = path.join(runtime.bundlePath('epsilon'), 'runc.log');
  t.ok(fs.statSync(log).size > 0, 'runc wrote its log');
  t.ok((err?.message.length ?? 0) < 6000, 'only a tail of it');
  await runtime.remove('epsilon');
});
