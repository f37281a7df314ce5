import t from 'tap';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { projectIdMap } from '../core/box';
import { run, sleep } from '../core/command';
import { fillBusyboxRootfs } from '../workers/bases/busyboxRootfs';
import { shiftTree } from '../workers/bases/idShift';
import type { ContainerSpec } from '../workers/drivers';
import { BoxServiceError, ExecInputError } from '../workers/errors';
import { BoxdServices } from '../workers/runtime/boxd/services';
import type { BoxServiceState } from '../workers/drivers';
import { RuncRuntime } from '../workers/runtime/runc';
import { claimDir } from './helpers/owner';
import { settleWithin } from '../core/timeout';

/**
 * boxd's service supervision on a real box: restart policies and backoff, stop with a signal and
 * a grace, logs with rotation, specs persisted in the box (tombstones for damaged ones, services
 * back after the box restarts), users and environment resolved inside the box.
 */
const hostTag = crypto.randomBytes(3).toString('hex');
const dataDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-boxd-svc-test-${hostTag}-`));
const runtime = new RuncRuntime({ dataDir, hostTag });
const idMap = projectIdMap(252);
const ns = `bh${hostTag}-svc`;
const boxId = 'svc';
let spec: ContainerSpec;

t.before(async () => {
  const rootfs = path.join(dataDir, 'roots', boxId);
  fs.mkdirSync(rootfs, { recursive: true });
  await fillBusyboxRootfs(rootfs);
  await shiftTree(rootfs, idMap);
  await run(['ip', 'netns', 'add', ns]);
  spec = { boxId, hostname: boxId, rootfs, netnsPath: `/run/netns/${ns}`, cpus: 1, ramMb: 128, environment: { GREETING: "it's boxd", SHARED: 'from-box', PEM: "-----BEGIN-----\nAB=CD\n'quoted'\n-----END-----" }, mounts: [], idMap };
  await runtime.start(spec);
});

t.teardown(async () => {
  await runtime.remove(boxId).catch(() => undefined);
  await run(['ip', 'netns', 'delete', ns], { allowFailure: true });
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const svcs = async (): Promise<BoxdServices> => new BoxdServices((await runtime.agent(boxId))!);
const ex = async (command: string[]) => (await runtime.exec(boxId, { command })).stdout;
const sh = (script: string) => ['sh', '-c', script];

async function until(what: string, f: () => Promise<boolean>, ms = 8000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await f()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function logsOf(name: string, tail?: number): Promise<string> {
  const data = await (await svcs()).logs(name, { tail });
  const chunks: Buffer[] = [];
  for await (const c of data) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString();
}

t.test('restart policies against a process that exits 0 and one that exits 1', async (t) => {
  const s = await svcs();
  const cases: Array<[string, 'always' | 'on-failure' | 'never', number, boolean]> = [
    ['always-ok', 'always', 0, true],
    ['always-bad', 'always', 1, true],
    ['onfail-ok', 'on-failure', 0, false],
    ['onfail-bad', 'on-failure', 1, true],
    ['never-ok', 'never', 0, false],
    ['never-bad', 'never', 1, false],
  ];
  for (const [name, restart, code] of cases) await s.start({ name, command: sh(`echo run; exit ${code}`), restart });
  await sleep(1600);
  for (const [name, , code, restarts] of cases) {
    const st = await s.get(name);
    t.equal(st.lastExitCode, code, `${name}: last_exit_code ${code}`);
    if (restarts) {
      // 250 ms doubling: 3 or 4 restarts in 1.6 s, not hundreds.
      t.ok(st.restarts >= 2 && st.restarts <= 5, `${name}: restarted with backoff (${st.restarts} restarts in 1.6 s)`);
      t.ok(['restarting', 'running'].includes(st.state), `${name}: ${st.state}`);
    } else {
      t.equal(st.restarts, 0, `${name}: not restarted`);
      t.equal(st.state, code === 0 ? 'exited' : 'failed', `${name}: ${code === 0 ? 'exited' : 'failed'}`);
    }
  }
  const list = await s.list();
  t.same(list.map((x) => x.name).sort(), cases.map((c) => c[0]).sort(), 'all listed');
  for (const [name] of cases) await s.remove(name);
  t.same(await s.list(), [], 'deleted: none listed');
  t.equal(await ex(['ls', '/etc/boxes/services']), '', 'their spec files are gone');
});

t.test('a start: user and environment resolved in the box, pid, replace, bad input changes nothing', async (t) => {
  const s = await svcs();
  const { service, replaced } = await s.start({
    name: 'web',
    command: sh('echo "uid=$(id -u) gid=$(id -g) home=$HOME pwd=$(pwd) g=$GREETING s=$SHARED"; exec sleep 1000'),
    user: 'box',
    cwd: '/tmp',
    env: { SHARED: 'from-spec' },
    port: 8080,
    tags: { tier: 'front' },
  });
  t.equal(replaced, false, 'new');
  t.equal(service.state, 'running');
  t.ok(service.pid > 1, `pid in the box (${service.pid})`);
  t.same(service.spec?.tags, { tier: 'front' }, "the node's own fields are kept in the spec");
  await until('the first log line', async () => (await logsOf('web')).includes('uid='));
  t.equal((await logsOf('web')).trim(), "uid=1000 gid=1000 home=/home/box pwd=/tmp g=it's boxd s=from-spec", "runs as box, in cwd, with /etc/boxes-env and the spec's env winning");
  t.equal((await ex(['cat', `/proc/${service.pid}/comm`])).trim(), 'sleep', 'the pid is the service process');
  t.match(await ex(['stat', '-c', '%a', '/etc/boxes/services/web.json']), /^600/, 'the spec file is private (its env may hold secrets)');

  const again = await s.start({ name: 'web', command: ['sleep', '1001'], restart: 'never' });
  t.equal(again.replaced, true, 'same name: replaced');
  t.not(again.service.pid, service.pid, 'a new process');
  t.equal((await ex(sh(`test -d /proc/${service.pid} && echo alive || echo gone`))).trim(), 'gone', 'the old one was stopped');

  const bad: Array<[string, Parameters<BoxdServices['start']>[0], string]> = [
    ['unknown user', { name: 'x1', command: ['true'], user: 'nosuchuser' }, 'user'],
    ['user outside the box ids', { name: 'x2', command: ['true'], user: '70000' }, 'user'],
    ['missing cwd', { name: 'x3', command: ['true'], cwd: '/nope' }, 'cwd'],
    ['missing command', { name: 'x4', command: ['no-such-command'] }, 'command'],
  ];
  for (const [what, sp, field] of bad) {
    await t.rejects(s.start(sp), ExecInputError, `${what}: 400`);
    await s.start(sp).catch((e: ExecInputError) => t.equal(e.field, field, `${what}: field ${field}`));
  }
  await t.rejects(s.start({ name: 'x5', command: ['true'], restart: 'sometimes' as 'never' }), BoxServiceError, 'bad restart policy');
  await t.rejects(s.start({ name: 'x6', command: ['true'], stop: { signal: 'NOPE' } }), BoxServiceError, 'bad stop signal');
  await t.rejects(s.start({ name: 'Bad_Name', command: ['true'] }), BoxServiceError, 'bad name');
  t.same((await s.list()).map((x) => x.name), ['web'], 'no rejected start left a service or a spec behind');
  await t.rejects(s.get('nope'), BoxServiceError, 'unknown service');
  await s.get('nope').catch((e: BoxServiceError) => t.equal(e.kind, 'not_found'));
  await s.remove('web');
});

t.test('stop: the signal, then SIGKILL after the grace; stays stopped until started', async (t) => {
  const s = await svcs();
  const trap = await s.start({ name: 'stubborn', command: sh('trap "" TERM; touch /tmp/trapped; while true; do sleep 0.1; done'), stop: { grace_secs: 1 } });
  // Stopped only once the shell has set its trap (a TERM before it would end it at once).
  await until('the trap is set', async () => (await ex(sh('test -e /tmp/trapped && echo yes || echo no'))).trim() === 'yes');
  const t0 = Date.now();
  const stopped = await s.stop('stubborn');
  const took = Date.now() - t0;
  t.equal(stopped.state, 'stopped');
  t.ok(took >= 900 && took < 5000, `ignored TERM: killed after the 1 s grace (${took} ms)`);
  t.equal((await ex(sh(`test -d /proc/${trap.service.pid} && echo alive || echo gone`))).trim(), 'gone');

  await s.start({ name: 'polite', command: sh('trap "echo got-usr1; exit 0" USR1; while true; do sleep 0.1; done'), stop: { signal: 'SIGUSR1', grace_secs: 30 } });
  await sleep(300);
  const t1 = Date.now();
  await s.stop('polite');
  t.ok(Date.now() - t1 < 15_000, 'the spec signal (USR1) ended it well within the 30 s grace');
  await until('the trap output', async () => (await logsOf('polite')).includes('got-usr1'));
  t.pass('the service got SIGUSR1');
  const st = await s.get('polite');
  t.equal(st.state, 'stopped');
  t.equal(st.spec?.disabled, true, 'marked disabled in its spec');
  await sleep(600);
  t.equal((await s.get('polite')).state, 'stopped', 'not restarted (policy always does not apply to a stop)');
  const resumed = await s.resume('polite');
  t.equal(resumed.state, 'running', 'started again from its stored spec');
  t.equal(resumed.spec?.disabled, undefined, 'enabled again');
  const restarted = await s.restart('polite');
  t.not(restarted.pid, resumed.pid, 'restart: a new process');
  await s.remove('polite');
  await s.remove('stubborn');
});

t.test('logs: tail, follow, rotation that bounds a chatty service', async (t) => {
  const s = await svcs();
  await s.start({ name: 'counter', command: sh('i=0; while [ $i -lt 50 ]; do echo line-$i; i=$((i+1)); done; exec sleep 1000') });
  await until('50 lines', async () => (await logsOf('counter', 1000)).includes('line-49'));
  t.equal(await logsOf('counter', 3), 'line-47\nline-48\nline-49\n', 'tail 3');
  await s.remove('counter');

  await s.start({ name: 'talker', command: sh('while true; do echo tick-$(date +%s%N); sleep 0.05; done') });
  const follow = await s.logs('talker', { tail: 1, follow: true });
  const seen: string[] = [];
  await new Promise<void>((resolve) => {
    follow.on('data', (c: Buffer) => {
      seen.push(...c.toString().split('\n').filter(Boolean));
      if (seen.length >= 6) resolve();
    });
  });
  follow.destroy();
  t.ok(seen.length >= 6 && seen.every((l) => l.startsWith('tick-')), `follow streams new lines (${seen.length})`);
  await s.remove('talker');

  await s.start({ name: 'flood', command: sh('head -c 5000000 /dev/zero | tr "\\0" "x" | fold -w 99; exec sleep 1000') });
  // Ended: fold is gone and both files hold still across two looks (the last of the pipe's
  // bytes may still be going out, and a rotation renames before it opens the next file).
  const statBoth = async () => (await ex(sh('stat -c "%s" /var/log/boxes/flood.log /var/log/boxes/flood.log.1 2>/dev/null'))).trim();
  let last = '';
  await until('the flood to end', async () => {
    const now = await statBoth();
    const settled = now.split('\n').length === 2 && now === last && (await ex(['pgrep', '-f', 'fold'])).trim() === '';
    last = now;
    return settled;
  }, 20_000);
  const sizes = last.split('\n').map(Number);
  t.ok(sizes.every((n) => n <= 1 << 20), `each log file at most 1 MiB (${sizes.join(', ')})`);
  t.ok(sizes[0] + sizes[1] <= 2 << 20, 'a 5 MB flood holds at most 2 MiB of the box');
  t.equal(await ex(sh('ls /var/log/boxes | grep -c flood')), '2\n', 'two files, no more');
  await s.remove('flood');
  t.equal(await ex(sh('ls /var/log/boxes | grep -c flood || true')), '0\n', 'delete removes the logs');
});

t.test('a damaged spec is a tombstone that hides nothing; specs come back with the box', async (t) => {
  const s = await svcs();
  await s.start({ name: 'keeper', command: ['sleep', '1000'] });
  await s.start({ name: 'resting', command: ['sleep', '1000'] });
  await s.stop('resting');
  const agent = (await runtime.agent(boxId))!;
  await agent.write('/etc/boxes/services/broken.json', Buffer.from('{"name": "broken", "command": '));
  await agent.write('/etc/boxes/services/wrongname.json', Buffer.from(JSON.stringify({ name: 'other', command: ['true'] })));
  const list = await s.list();
  const by = (n: string) => list.find((x) => x.name === n) as BoxServiceState;
  t.same(list.map((x) => x.name), ['broken', 'keeper', 'resting', 'wrongname'], 'every spec listed');
  t.equal(by('broken').state, 'corrupt');
  t.match(by('broken').error, /not a JSON object/, 'the tombstone says why');
  t.equal(by('wrongname').state, 'corrupt');
  t.match(by('wrongname').error, /does not match the file name/);
  t.equal(by('keeper').state, 'running', 'the healthy one next to them');
  t.equal((await s.get('broken')).state, 'corrupt', 'get shows the tombstone too');
  await t.rejects(s.resume('broken'), BoxServiceError, 'a corrupt spec cannot start');

  const before = by('keeper').pid;
  await runtime.stop(boxId, 5);
  await runtime.start(spec);
  await until('keeper back', async () => (await (await svcs()).get('keeper')).state === 'running');
  const after = await (await svcs()).list();
  const a = (n: string) => after.find((x) => x.name === n) as BoxServiceState;
  t.equal(a('keeper').state, 'running', 'an enabled service starts with the box');
  t.ok(a('keeper').pid > 0 && a('keeper').pid !== before, 'a new process');
  t.equal(a('resting').state, 'stopped', 'a stopped one stays stopped');
  t.equal(a('broken').state, 'corrupt', 'the tombstone is still there');
  await (await svcs()).remove('broken');
  t.notOk((await (await svcs()).list()).some((x) => x.name === 'broken'), 'delete clears a tombstone');
  for (const n of ['keeper', 'resting', 'wrongname']) await (await svcs()).remove(n);
});

t.test('hostile files in the box: a multi-line environment value, a spec that is a FIFO, a log directory that is a link', async (t) => {
  const s = await svcs();
  await s.start({ name: 'envdump', command: sh('printf "%s|" "$PEM"; if [ -n "${AB+x}" ]; then echo AB-set; else echo AB-unset; fi'), restart: 'never' });
  await until('the dump', async () => (await logsOf('envdump')).includes('|'));
  t.equal(await logsOf('envdump'), "-----BEGIN-----\nAB=CD\n'quoted'\n-----END-----|AB-unset\n", 'a value over several lines arrives whole, its lines are not variables');
  await s.remove('envdump');

  await ex(sh('mkfifo /etc/boxes/services/pipe.json'));
  const list = await s.list();
  t.equal(list.find((x) => x.name === 'pipe')?.state, 'corrupt', 'a FIFO named like a spec is a tombstone, not a hang');
  await s.remove('pipe');

  // FIFOs where boxd opens files: an open of a FIFO waits for its other end, and boxd lets at
  // most 8 file calls block at once (boxd/threads.go): none of them may wait on one. Before,
  // a service log that was a FIFO held its logs call for ever, and 12 reads of a FIFO would
  // have held every slot, so the read of a plain file after them answered nothing.
  await ex(sh('mkfifo /var/log/boxes/fifolog.log /tmp/pipe && printf hello > /tmp/plain'));
  await s.start({ name: 'fifolog', command: sh('echo into-a-fifo; exec sleep 1000') });
  const logs = await settleWithin<unknown>(logsOf('fifolog'), 8000, 'no answer in 8 s');
  t.equal(logs, '', 'the logs of a service whose log is a FIFO answer, with nothing');
  t.ok(fs.statSync(path.join(spec.rootfs, 'var/log/boxes/fifolog.log')).isFIFO(), 'and the FIFO is left as it was');
  await s.remove('fifolog');
  const agent = (await runtime.agent(boxId))!;
  const drain = async (r: { data: NodeJS.ReadableStream }) => {
    const chunks: Buffer[] = [];
    for await (const c of r.data) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString();
  };
  const fifoReads = Array.from({ length: 12 }, () => agent.read('/tmp/pipe').then(drain, (e: Error) => `failed: ${e.message}`));
  await sleep(300);
  t.equal(await agent.read('/tmp/plain').then(drain, (e: Error) => `failed: ${e.message}`), 'hello', 'a plain file is read while 12 reads wait on a FIFO');
  // A writer for the FIFO (opened read-write, it is one): the waiting reads open, then end.
  await ex(sh('exec 3<>/tmp/pipe; sleep 0.5'));
  t.same(await Promise.all(fifoReads), Array(12).fill(''), 'and the FIFO reads end once it has a writer');
  await ex(sh('rm /var/log/boxes/fifolog.log /tmp/pipe /tmp/plain'));

  await ex(sh('rm -rf /var/log/boxes && mkdir -p /tmp/elsewhere && ln -s /tmp/elsewhere /var/log/boxes'));
  await s.start({ name: 'linked', command: sh('echo into-the-link; exec sleep 1000') });
  await sleep(500);
  t.equal(await ex(sh('ls /tmp/elsewhere | wc -l')), '0\n', 'boxd writes no log through a linked log directory');
  await s.remove('linked');
  await ex(sh('rm /var/log/boxes && mkdir -p /var/log/boxes && chmod 0777 /var/log/boxes'));
  await s.start({ name: 'open', command: sh('echo into-open; exec sleep 1000') });
  await sleep(500);
  t.equal(await ex(sh('ls /var/log/boxes | wc -l')), '0\n', 'nor into one that others may write');
  await s.remove('open');
  await ex(sh('chmod 0755 /var/log/boxes'));
});

t.test('exec names a user boxd resolves in the box', async (t) => {
  t.equal((await runtime.exec(boxId, { command: ['id'], user: 'box' })).stdout.trim(), 'uid=1000(box) gid=1000(box)');
  t.equal((await runtime.exec(boxId, { command: ['id', '-u'], user: 'daemon:box' })).stdout.trim(), '1');
  t.equal((await runtime.exec(boxId, { command: ['sh', '-c', 'id -G'], user: 'root' })).stdout.trim(), '0 10', 'supplementary groups from /etc/group');
  await t.rejects(runtime.exec(boxId, { command: ['id'], user: 'ghost' }), ExecInputError, 'unknown user: 400');
  await t.rejects(runtime.exec(boxId, { command: ['id'], user: 'box:ghosts' }), ExecInputError, 'unknown group: 400');
  await t.rejects(runtime.exec(boxId, { command: ['id'], user: String(idMap.size) }), ExecInputError, 'an id the box does not map: 400');
});
