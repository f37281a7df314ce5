import t from 'tap';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { projectIdMap } from '../core/box';
import { run, sleep } from '../core/command';
import { fillBusyboxRootfs } from '../workers/bases/busyboxRootfs';
import { shiftTree } from '../workers/bases/idShift';
import type { ContainerSpec } from '../workers/drivers';
import { Readable } from 'node:stream';
import { BoxAgentUnavailableError, BoxFileError, BoxNotRunningError, ExecInputError } from '../workers/errors';
import { encodeFrame, Frame } from '../workers/runtime/boxd/protocol';
import { DEFAULT_CAPABILITIES } from '../workers/runtime/ociSpec';
import { RuncRuntime } from '../workers/runtime/runc';
import { claimDir } from './helpers/owner';

/**
 * boxd on real boxes (runc, user namespace, seccomp): what its children inherit, what a box
 * process cannot do to it, the protocol under garbage, a box that predates boxd.
 */
const hostTag = crypto.randomBytes(3).toString('hex');
const dataDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-boxd-test-${hostTag}-`));
const runtime = new RuncRuntime({ dataDir, hostTag });
const legacy = new RuncRuntime({ dataDir: path.join(dataDir, 'legacy'), hostTag, init: 'tini' });
const idMap = projectIdMap(251);
const netns: string[] = [];

async function makeBox(boxId: string): Promise<ContainerSpec> {
  const rootfs = path.join(dataDir, 'roots', boxId);
  fs.mkdirSync(rootfs, { recursive: true });
  await fillBusyboxRootfs(rootfs);
  await shiftTree(rootfs, idMap);
  const ns = `bh${hostTag}-${boxId}`;
  await run(['ip', 'netns', 'add', ns]);
  netns.push(ns);
  return { boxId, hostname: boxId, rootfs, netnsPath: `/run/netns/${ns}`, cpus: 1, ramMb: 128, environment: {}, mounts: [], idMap };
}

t.teardown(async () => {
  for (const id of ['one', 'two']) await runtime.remove(id).catch(() => undefined);
  await legacy.remove('old').catch(() => undefined);
  for (const ns of netns) await run(['ip', 'netns', 'delete', ns], { allowFailure: true });
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const statusField = (status: string, key: string) => new RegExp(`^${key}:\\s+(.*)$`, 'm').exec(status)?.[1];

t.test('a box with boxd', async (t) => {
  const spec = await makeBox('one');
  await runtime.start(spec);
  const ex = (command: string[], opts = {}) => runtime.exec('one', { command, ...opts });
  const pid1 = JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId('one')])).stdout).pid as number;
  const hello = await (await runtime.agent('one'))!.hello();
  t.equal(hello.protocol, 1, 'boxd answers its hello: protocol 1');
  t.equal(hello.pid, 1, 'boxd is PID 1 of the box');

  t.test("a child of boxd is confined as PID 1 is: seccomp, capabilities, no_new_privs, cgroup", async (t) => {
    const status = (await ex(['cat', '/proc/self/status'])).stdout;
    const host1 = fs.readFileSync(`/proc/${pid1}/status`, 'utf8');
    t.equal(statusField(status, 'Seccomp'), '2', 'seccomp filter');
    t.equal(statusField(status, 'NoNewPrivs'), '1');
    for (const k of ['CapEff', 'CapPrm', 'CapBnd']) t.equal(statusField(status, k), statusField(host1, k), `${k} as PID 1's`);
    t.equal(statusField(status, 'CapBnd'), '00000000800405fb', `the box's ${DEFAULT_CAPABILITIES.length} capabilities`);
    t.equal((await ex(['cat', '/proc/self/cgroup'])).stdout, (await ex(['cat', '/proc/1/cgroup'])).stdout, "PID 1's cgroups");
    const hostCgroup = fs.readFileSync(`/sys/fs/cgroup/memory${runtime.cgroupsPath('one')}/cgroup.procs`, 'utf8');
    t.ok(hostCgroup.split('\n').includes(String(pid1)), 'in the box cgroup on the host');
    t.equal((await ex(['cat', '/proc/self/uid_map'])).stdout.trim().split(/\s+/).join(' '), `0 ${idMap.hostId} ${idMap.size}`, 'in the user namespace');
    // Made by `boxd netns` (boxd/netns.go): gids mapped too, setgroups left allowed, lo up.
    t.equal((await ex(['cat', '/proc/self/gid_map'])).stdout.trim().split(/\s+/).join(' '), `0 ${idMap.hostId} ${idMap.size}`, 'gids mapped alike');
    t.equal((await ex(['cat', '/proc/self/setgroups'])).stdout.trim(), 'allow', 'setgroups allowed (su, package managers)');
    t.equal(Number((await ex(['cat', '/sys/class/net/lo/flags'])).stdout.trim()) & 1, 1, 'its loopback is up (IFF_UP)');
    t.equal((await ex(['ls', '/sys/class/net'])).stdout.trim(), 'lo', 'and it is alone in the netns');
    t.ok(await runtime.netnsLoopbackUp('one', spec.netnsPath), 'the runtime knows it made the netns with lo up');
    const fds = (await ex(['ls', '/proc/self/fd'])).stdout.trim().split(/\s+/).sort();
    t.same(fds, ['0', '1', '2', '3'], 'no descriptor of boxd leaks into a process (3 is ls reading the directory)');
    t.match((await ex(['ls', '-l', '/proc/self/fd/'])).stdout, /pipe:/, 'stdio are pipes');
  });

  t.test('a box process cannot stop, trace or impersonate boxd', async (t) => {
    const kills = await ex(['sh', '-c', 'for s in $(seq 1 31) $(seq 34 64); do kill -$s 1 2>/dev/null; done; echo sent']);
    t.equal(kills.stdout, 'sent\n');
    // The seccomp profile refuses kill(2) at pid 1 but its probe (signal 0).
    t.match((await ex(['sh', '-c', 'kill -TERM 1'])).stderr, /not permitted/, 'kill -TERM 1 is refused');
    t.equal((await ex(['sh', '-c', 'kill -0 1'])).exitCode, 0, 'kill -0 1 (is it there?) works');
    t.equal((await ex(['sh', '-c', 'sleep 100 & kill -TERM $!; wait $!; echo $?'])).stdout, '143\n', 'a signal to any other process works');
    await sleep(200);
    t.equal((await ex(['echo', 'alive'])).stdout, 'alive\n', 'every signal from inside leaves boxd serving');
    t.equal(await runtime.status('one'), 'running');
    // fd 0: boxd's stdio stays open; 3 does not (the listener moves to a duplicate and fd 3 is
    // whatever boxd opened last, or nothing: "No such file" once in CI).
    t.match((await ex(['ls', '/proc/1/fd'])).stdout, /^0$/m, "control: boxd's fd 0 is there");
    for (const f of ['mem', 'environ', 'fd/0']) {
      const r = await ex(['cat', `/proc/1/${f}`]);
      t.match(r.stderr, /Permission denied/, `/proc/1/${f} is closed to root in the box (not dumpable)`);
    }
    const links = (await ex(['sh', '-c', 'for f in /proc/1/fd/*; do readlink "$f" 2>/dev/null || echo denied; done'])).stdout.trim().split('\n');
    t.ok(links.length > 0 && links.every((l) => l === 'denied'), `where boxd's descriptors lead is not readable: ${links.join(' ')}`);
    t.equal(fs.readFileSync(`/proc/${pid1}/status`, 'utf8').match(/^TracerPid:\s+(\d+)/m)?.[1], '0');
    const sockets = await ex(['sh', '-c', 'find / -xdev -type s 2>/dev/null | wc -l']);
    t.equal(sockets.stdout.trim(), '0', 'no socket of boxd in the box filesystem: its listening socket lives on the host');
    t.notOk(fs.existsSync(path.join(spec.rootfs, path.basename(runtime.boxdSocketPath('one')))));
    t.equal(fs.statSync(runtime.boxdSocketPath('one')).mode & 0o077, 0, 'the host socket is for root only');
    t.equal(fs.statSync(path.dirname(runtime.boxdSocketPath('one'))).mode & 0o777, 0o700);
  });

  t.test('kill -9 of everything in the box but PID 1 leaves the box serving', async (t) => {
    await ex(['sleep', '1000'], { detach: true });
    await ex(['sh', '-c', 'sleep 1000 & sleep 1000 & wait'], { detach: true });
    t.ok((await ex(['ps', '-o', 'args'])).stdout.includes('sleep 1000'));
    const r = await ex(['sh', '-c', 'kill -9 -1; echo after']);
    t.equal(r.stdout, 'after\n', 'kill -1 spares only PID 1 and the killer');
    await sleep(200);
    const ps = (await ex(['ps', '-o', 'pid,args'])).stdout.trim().split('\n').slice(1);
    t.match(ps[0], /^\s*1 \/\.boxhost\/boxd$/);
    t.equal(ps.length, 2, `only boxd and ps: ${ps.join(' | ')}`);
    t.notMatch((await ex(['ps', '-o', 'stat'])).stdout, /^\s*Z/m, 'and no zombie');
  });

  t.test('orphans exiting all at once are all reaped (SIGCHLD alone: boxd has no timer)', async (t) => {
    // 200 orphans (double forks: their parent is gone, so PID 1 inherits them), killed
    // together: their SIGCHLDs merge, and each merged delivery must still reap them all.
    await ex(['sh', '-c', 'for i in $(seq 200); do (sleep 1000 &); done']);
    const ps = async () => {
      const r = await ex(['ps', '-o', 'stat,args']);
      const lines = r.stdout.split('\n');
      t.ok(r.exitCode === 0 && /STAT/.test(lines[0]), 'ps answers');
      return { orphans: lines.filter((l) => /\ssleep 1000$/.test(l)).length, zombies: lines.filter((l) => /^\s*Z/.test(l)).length };
    };
    t.equal((await ps()).orphans, 200, 'control: the 200 orphans run under PID 1');
    await ex(['sh', '-c', 'kill -9 $(pidof sleep)']);
    let left = { orphans: -1, zombies: -1 };
    for (let i = 0; i < 50 && left.orphans + left.zombies !== 0; i++) {
      await sleep(100);
      left = await ps();
    }
    t.same(left, { orphans: 0, zombies: 0 }, 'none left, not even a zombie, within 5 s');
  });

  t.test('stdin, early failures and a slow reader', async (t) => {
    // A process that never reads its stdin: 3 MiB queued for it (past the 1 MiB window) do not
    // keep the abort from reaching boxd.
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    const t0 = Date.now();
    const stuck = await ex(['sleep', '1000'], { stdin: Buffer.alloc(3 << 20, 0x61), signal: ac.signal });
    t.equal(stuck.exitCode, 137, 'aborted');
    t.ok(Date.now() - t0 < 5000, `at once (${Date.now() - t0} ms)`);
    t.notMatch((await ex(['ps', '-o', 'args'])).stdout, /sleep 1000/, 'and gone');
    const cat = await ex(['sh', '-c', 'sleep 0.3; wc -c'], { stdin: Buffer.alloc(5 << 20, 0x62) });
    t.equal(cat.stdout.trim(), String(5 << 20), '5 MiB of stdin through the window, every byte');
    // Failures before the process runs, with stdin sent: the answer, not a broken connection.
    t.equal((await ex(['no-such-command'], { stdin: Buffer.from('hello\n') })).exitCode, 127);
    await t.rejects(ex(['pwd'], { cwd: '/no/such', stdin: Buffer.from('hello\n') }), ExecInputError);
    await t.rejects(ex(['no-such-command'], { detach: true }), ExecInputError, 'a detached process that cannot start is an error, not pid 0');
    // A reader slower than the process loses nothing after the process has exited.
    const p = await runtime.execStream('one', { command: ['sh', '-c', 'head -c 1000000 /dev/zero; echo tail'] });
    p.stderr.resume();
    const got: Buffer[] = [];
    for await (const c of p.stdout) {
      got.push(c as Buffer);
      await sleep(20);
    }
    const all = Buffer.concat(got);
    t.equal(all.length, 1000005, 'every byte');
    t.equal(all.subarray(-5).toString(), 'tail\n');
    t.same(await p.exited, { exitCode: 0, timedOut: false });
  });

  t.test('the protocol under garbage: boxd survives, the node refuses', async (t) => {
    const sock = runtime.boxdSocketPath('one');
    const send = (bytes: Buffer) =>
      new Promise<Buffer>((resolve) => {
        const c = net.createConnection(sock);
        const got: Buffer[] = [];
        c.on('data', (b: Buffer) => got.push(b));
        c.on('error', () => undefined);
        c.on('close', () => resolve(Buffer.concat(got)));
        c.end(bytes);
        setTimeout(() => c.destroy(), 2000);
      });
    const rnd = (n: number) => crypto.randomBytes(n);
    const cases: Buffer[] = [
      Buffer.from([0x58, 0xff, 0xff, 0xff, 0xff]), // a length past MAX_FRAME
      encodeFrame(Frame.exec, 'not json'),
      encodeFrame(Frame.exec, { v: 99, argv: ['true'] }),
      encodeFrame(Frame.exec, { v: 1, argv: [] }),
      encodeFrame(Frame.exec, { v: 1, argv: ['true'], cwd: 'relative' }),
      encodeFrame(Frame.exec, { v: 1, argv: ['true'], cwd: '/', uid: -1 }),
      encodeFrame(Frame.exec, { v: 1, argv: ['a\u0000b'], cwd: '/' }),
      encodeFrame(Frame.exec, { v: 1, argv: ['true'], cwd: '/', env: ['NOEQUALS'] }),
      encodeFrame(Frame.exec, { v: 1, argv: ['true'], cwd: '/', timeoutMs: -5 }),
      Buffer.concat([encodeFrame(Frame.exec, { v: 1, argv: ['sleep', '5'], cwd: '/' }), encodeFrame(Frame.signal, 'x'), encodeFrame(Frame.resize, '[]'), encodeFrame('Z', rnd(10))]),
      encodeFrame(Frame.shutdown, '{}'),
      encodeFrame(Frame.stdin, rnd(100)),
    ];
    for (let i = 0; i < 200; i++) {
      const r = rnd(1 + (i % 64));
      if (i % 3 === 0) r[0] = Frame.exec.charCodeAt(0);
      cases.push(r);
    }
    for (let i = 0; i < 60; i++) {
      const fields = ['v', 'argv', 'env', 'cwd', 'uid', 'gid', 'groups', 'tty', 'cols', 'rows', 'stdin', 'detach', 'timeoutMs'];
      const values = [1, 0, -1, 2 ** 40, 'x', '/', ['true'], [1, 2], null, true, {}, '\u0000'];
      const o: Record<string, unknown> = {};
      for (const f of fields) if (crypto.randomInt(2)) o[f] = values[crypto.randomInt(values.length)];
      cases.push(encodeFrame(Frame.exec, o));
    }
    let answered = 0;
    for (const c of cases) if ((await send(c)).length > 0) answered++;
    t.ok(answered > 0, `boxd answered ${answered} of ${cases.length} garbage requests (with a failure frame)`);
    const hello = await (await runtime.agent('one'))!.hello();
    t.equal(hello.pid, 1, 'boxd is still PID 1, the same process');
    t.equal(JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId('one')])).stdout).pid, pid1);
    t.equal((await ex(['echo', 'ok'])).stdout, 'ok\n', 'and serves');
    t.notMatch((await ex(['ps', '-o', 'args'])).stdout, /sleep 5/, 'the exec whose connection ended is killed');
  });

  t.test("a boxd that cannot be reached: 503 for a running box, 409 for a stopped one", async (t) => {
    const sock = runtime.boxdSocketPath('one');
    fs.renameSync(sock, `${sock}.away`);
    try {
      await t.rejects(ex(['true']), BoxAgentUnavailableError);
      await t.rejects(runtime.execStream('one', { command: ['true'] }).then((p) => p.exited), BoxAgentUnavailableError);
    } finally {
      fs.renameSync(`${sock}.away`, sock);
    }
    t.equal((await ex(['true'])).exitCode, 0);
    // A silent boxd (a server that never answers) is given up on after the answer timeout.
    const { BoxdClient } = await import('../workers/runtime/boxd/client');
    const mute = path.join(dataDir, 'mute.sock');
    const server = net.createServer(() => undefined).listen(mute);
    await new Promise((r) => server.once('listening', r));
    const client = new BoxdClient(mute, 300);
    await t.rejects(client.hello(), BoxAgentUnavailableError);
    await t.rejects(client.exec({ v: 1, argv: ['true'], env: [], cwd: '/', uid: 0, gid: 0, groups: [], tty: false, echo: false, cols: 80, rows: 24, stdin: false, detach: false, timeoutMs: 0 }).exited, /did not start the process within 300 ms/);
    server.close();
  });

  t.test('files: every path resolves inside the box', async (t) => {
    const files = (await runtime.agent('one'))!;
    const kindOf = (p: Promise<unknown>) => p.then(() => 'succeeded', (e) => (e instanceof BoxFileError ? e.kind : String(e)));
    const hostSecret = path.join(dataDir, 'host-secret');
    fs.writeFileSync(hostSecret, 'host only');
    // Written, read back, listed, stat'ed, all as the box sees it.
    const info = await files.write('/srv/app/conf.txt', Buffer.from('hello\n'), { mode: 0o640, parents: true });
    t.same([info.type, info.size, info.mode, info.uid], ['file', 6, 0o640, 0]);
    t.equal((await ex(['cat', '/srv/app/conf.txt'])).stdout, 'hello\n', 'the box sees what was written');
    t.equal(fs.statSync(path.join(spec.rootfs, 'srv/app/conf.txt')).uid, idMap.hostId, "owned by the box's root on the host");
    const read = await files.read('/srv/app/conf.txt');
    const chunks: Buffer[] = [];
    for await (const c of read.data) chunks.push(c as Buffer);
    t.equal(Buffer.concat(chunks).toString(), 'hello\n');
    const big = crypto.randomBytes(5 * 1024 * 1024 + 17);
    await files.write('/tmp/big.bin', Readable.from([big.subarray(0, 1000), big.subarray(1000)]));
    const back: Buffer[] = [];
    for await (const c of (await files.read('/tmp/big.bin')).data) back.push(c as Buffer);
    t.ok(Buffer.concat(back).equals(big), '5 MB streamed both ways, unchanged');
    t.same((await files.mkdir('/srv/a/b/c', { parents: true })).type, 'dir');
    await files.write('/srv/a/b/c/f', Buffer.from('x'));
    const ls = await files.list('/srv/a/b/c');
    t.same(ls.entries.map((e) => [e.name, e.type]), [['f', 'file']]);
    t.equal((await files.chmod('/srv/a/b/c/f', 0o4755)).mode, 0o4755);
    await files.remove('/srv/a', { recursive: true });
    await t.rejects(files.stat('/srv/a'), BoxFileError);
    t.equal(await kindOf(files.stat('/nope')), 'not_found');
    t.equal(await kindOf(files.remove('/srv')), 'invalid', 'a non-empty directory without recursive');
    t.equal(await kindOf(files.read('/srv')), 'invalid', 'a directory is not read as a file');
    t.equal(await kindOf(files.stat('relative')), 'input');
    t.equal(await kindOf(files.remove('/', { recursive: true })), 'input');
    // Links and dot-dots never leave the box.
    await ex(['ln', '-s', hostSecret, '/tmp/esc']);
    await ex(['ln', '-s', dataDir, '/tmp/escdir']);
    t.equal(await kindOf(files.read('/tmp/esc')), 'not_found', 'a link to a host path reads the box path, which is not there');
    t.equal(await kindOf(files.write('/tmp/escdir/planted', Buffer.from('x'))), 'not_found', 'a write through a link to a host dir');
    t.notOk(fs.existsSync(path.join(dataDir, 'planted')), 'nothing planted on the host');
    t.equal((await files.stat('/../../../etc/hostname')).name, 'hostname', '/.. is the box root');
    await files.write('/tmp/esc', Buffer.from('replaced'));
    t.equal(fs.readFileSync(hostSecret, 'utf8'), 'host only', 'writing over a link replaces the link in the box, never the host file');
    t.equal((await ex(['cat', '/tmp/esc'])).stdout, 'replaced');
    const proc = await files.stat('/proc/1/root').catch((e) => e);
    t.ok(proc instanceof BoxFileError || proc.type === 'symlink', "/proc is the box's");
    t.same(fs.readdirSync(path.join(spec.rootfs, 'tmp')).filter((n) => n.includes('.boxd-')), [], 'no temporary file is left');
  });

  t.test('stop goes through boxd; a stopped box says it is not running', async (t) => {
    await ex(['sh', '-c', 'trap "exit 0" TERM; while true; do sleep 0.1; done'], { detach: true });
    const t0 = Date.now();
    await runtime.stop('one', 10);
    t.ok(Date.now() - t0 < 8000, `the box ended on the node's shutdown, not at the end of the 10 s grace (${Date.now() - t0} ms)`);
    t.equal(await runtime.status('one'), null);
    t.notOk(fs.existsSync(runtime.boxdSocketPath('one')), 'its socket is gone');
    await t.rejects(ex(['true']), BoxNotRunningError);
    await runtime.start(spec);
    t.equal((await ex(['echo', 'back'])).stdout, 'back\n', 'a new boxd after a start');
  });
});

t.test('a box started before boxd (tini as PID 1) still runs commands, through runc exec', async (t) => {
  const spec = await makeBox('old');
  await legacy.start(spec);
  t.equal(await legacy.agent('old'), null, 'no boxd');
  const r = await legacy.exec('old', { command: ['sh', '-c', 'ps -o pid,args | sed -n 2p; echo err >&2; exit 3'] });
  t.match(r.stdout, /^\s*1 \/\.boxhost\/tini /);
  t.equal(r.stderr, 'err\n');
  t.equal(r.exitCode, 3);
  // A runtime that starts boxes with boxd still knows this one by its bundle.
  const current = new RuncRuntime({ dataDir: path.join(dataDir, 'legacy'), hostTag });
  t.equal(await current.agent('old'), null);
  t.equal((await current.exec('old', { command: ['echo', 'still'] })).stdout, 'still\n');
  await legacy.stop('old', 5);
  t.equal(await legacy.status('old'), null);
});
