import net from 'node:net';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { run, sleep } from '../core/command';
import { machineMountLock } from '../workers/storage/zfsFuse';

/** What the driver's commands that mount hold on zfs-fuse (workers/storage/zfsCommon.ts). */
const ZFS_FUSE_MOUNT_LOCK = machineMountLock();

/** Box routes end to end on real runc + ZFS + CNI + Redis, through HTTP. */
t.test('boxes', async (t) => {
  const host = await startTestHost(t);
  const P = '/v1/projects';
  const create = (project: string, body: object, wait = 60) => host.call('POST', `${P}/${project}/boxes?wait=${wait}`, { body });
  const exec = (project: string, name: string, body: object) => host.call('POST', `${P}/${project}/boxes/${name}/exec`, { body });
  const sh = async (project: string, name: string, script: string, extra: object = {}) => {
    const r = await exec(project, name, { command: ['sh', '-c', script], ...extra });
    if (r.status !== 200) throw new Error(`exec ${r.status}: ${r.text}`);
    return r.body as { exit_code: number; stdout: string; stderr: string; process: number; detached: boolean };
  };
  // This host's pool only: the suite runs other files beside this one, each with its own pool.
  const zfsList = async () => (await run(['zfs', 'list', '-H', '-r', '-o', 'name', '-t', 'all', `boxhost-${host.config.hostTag}`])).stdout;
  const boxRoot = (id: string) => `/boxes/${id}`;
  /** Renames a dataset of this host's pool, until it is done. zfs-fuse answers "busy" for a while
   *  after a dataset was used (longer under the suite's load: 2 s of tries were not enough in
   *  CI), and a rename whose remount fails exits 1 with the rename done: the names are looked at,
   *  not the exit code. Each command is bounded (a hung zfs, the machine's mount lock held
   *  elsewhere: 20 s for the lock, 20 s for the command): one that times out is one more
   *  failed try. */
  const moveDataset = async (from: string, to: string, ms = 60_000) => {
    const zfs = (args: string[], lock: boolean) =>
      run(['zfs', ...args], { allowFailure: true, timeoutMs: 20_000, ...(lock ? { lockFile: ZFS_FUSE_MOUNT_LOCK } : {}) }).catch(() => null);
    // Absent only when zfs says so: a listing that failed otherwise (timed out, the daemon busy)
    // is not taken for a dataset gone.
    const state = async (ds: string) => {
      const r = await zfs(['list', '-H', '-o', 'name', ds], false);
      return r?.exitCode === 0 ? 'there' : r && /does not exist/.test(r.stderr) ? 'absent' : 'unknown';
    };
    const moved = async () => (await state(to)) === 'there' && (await state(from)) === 'absent';
    for (const end = Date.now() + ms; Date.now() < end; await sleep(200)) {
      if (await moved()) return true;
      await zfs(['umount', from], true);
      await zfs(['rename', from, to], true);
    }
    return moved();
  };

  t.test('create → running; the box is a real isolated container', async (t) => {
    const accepted = await host.call('POST', `${P}/alpha/boxes`, { body: { name: 'web', environment: { GREETING: "it's me" }, tags: { tier: 'front', team: 'a' } } });
    t.equal(accepted.status, 202);
    t.equal(accepted.body.status, 'creating');
    t.equal(accepted.headers.get('location'), `${P}/alpha/boxes/web`);
    const opId = accepted.headers.get('operation-id')!;
    t.match(opId, /^op_/);
    const op = await host.call('GET', `/v1/operations/${opId}/wait?timeout=60`);
    t.equal(op.body.status, 'succeeded', JSON.stringify(op.body));
    const box = (await host.call('GET', `${P}/alpha/boxes/web`)).body;
    t.equal(box.status, 'running');
    t.match(box.base, /^busybox@[0-9a-f]{12}$/);
    t.same(box.config, { cpus: 1, ram_mb: 512, storage_gb: 2, region: 'local' });
    t.match(box.address, /^10\.\d+\.\d+\.\d+$/);
    t.ok((await zfsList()).includes(boxRoot(box.id)), 'root dataset exists');

    t.equal((await sh('alpha', 'web', 'hostname')).stdout.trim(), 'web', 'hostname is the box name');
    const ps = (await sh('alpha', 'web', 'ps -o pid,comm')).stdout.trim().split('\n').slice(1);
    t.ok(ps.length <= 6, `ps shows only the box's processes: ${ps.join(' | ')}`);
    t.match(ps[0], /^\s*1 boxd/);
    t.not((await sh('alpha', 'web', 'mount -t tmpfs none /mnt')).exit_code, 0, 'mount fails');
    t.not((await sh('alpha', 'web', 'echo x > /sys/kernel/uevent_helper')).exit_code, 0, 'writing /sys fails');
    t.equal((await sh('alpha', 'web', 'cat /etc/boxes-env')).stdout, "GREETING='it'\\''s me'\n");
    t.equal((await sh('alpha', 'web', 'echo "$GREETING"')).stdout, "it's me\n", 'environment is set');
    const quota = (await run(['zfs', 'get', '-Hp', '-o', 'value', 'refquota', (await zfsList()).split('\n').find((l) => l.endsWith(boxRoot(box.id)))!])).stdout.trim();
    t.equal(Number(quota), 2 * 1024 ** 3, 'storage_gb (default 2) is the refquota');
  });

  t.test('exec flags', async (t) => {
    const plain = await exec('alpha', 'web', { command: ['sh', '-c', 'echo out; echo err >&2; exit 3'] });
    t.match(plain.body, { detached: false, exit_code: 3, stdout: 'out\n', stderr: 'err\n' });
    t.ok(plain.body.process > 0);
    t.equal((await exec('alpha', 'web', { command: ['echo', '$HOME', '&&', 'echo', 'two'], shell: true })).body.stdout, '/root\ntwo\n', 'shell joins and runs under sh -c');
    t.equal((await sh('alpha', 'web', 'pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
    t.equal((await sh('alpha', 'web', 'echo $A-$GREETING', { env: { A: 'x', GREETING: 'override' } })).stdout, 'x-override\n', 'env wins over the box environment');
    t.equal((await sh('alpha', 'web', 'id -u', { user: 'box' })).stdout, '1000\n', 'user by name');
    const tty = await exec('alpha', 'web', { command: ['sh', '-c', '[ -t 1 ] && echo tty'], tty: true });
    t.match(tty.body.stdout, /tty/);
    const start = Date.now();
    // The process runs 10 s: an answer well before that is one that did not wait for it.
    const detached = await exec('alpha', 'web', { command: ['sh', '-c', 'sleep 10; echo late > /tmp/late'], no_hup: true });
    t.ok(Date.now() - start < 8000, `no_hup returns at once (${Date.now() - start} ms)`);
    t.match(detached.body, { detached: true, exit_code: -1 });
    t.ok(detached.body.process > 0);
    const timed = await exec('alpha', 'web', { command: ['sleep', '30'], timeout_secs: 1 });
    t.equal(timed.body.exit_code, 124, 'timeout kills with 124');
    // Waits for the event itself: the file the detached process writes at its end.
    let late = '';
    for (let i = 0; i < 100 && late !== 'late\n'; i++) {
      late = (await sh('alpha', 'web', 'cat /tmp/late 2>/dev/null')).stdout;
      if (late !== 'late\n') await new Promise((r) => setTimeout(r, 200));
    }
    t.equal(late, 'late\n', 'the detached process ran on');

    const missing = await exec('alpha', 'web', { command: ['true'], cwd: '/does/not/exist' });
    t.equal(missing.status, 400);
    const unknownUser = await exec('alpha', 'web', { command: ['true'], user: 'nobody-here' });
    t.equal(unknownUser.status, 400);
    t.equal((await exec('alpha', 'web', { command: [] })).status, 400);
    t.equal((await exec('alpha', 'web', { command: ['true'], cwd: 'relative' })).status, 400);
    t.equal((await exec('alpha', 'nope', { command: ['true'] })).status, 404);
  });

  t.test('exec cwd /proc/self/fd/N never lands on a host directory (CVE-2024-21626 class)', async (t) => {
    // Every fd answers one of two ways, and each is asserted: refused with the contract's 400
    // (the directory does not exist in the box), or run inside the box's own root.
    const outcomes = { refused: 0, ran: 0 };
    for (let fd = 3; fd <= 20; fd++) {
      const r = await exec('alpha', 'web', { command: ['sh', '-c', 'pwd; ls /; cat /etc/hostname'], cwd: `/proc/self/fd/${fd}` });
      if (r.status === 400) {
        outcomes.refused++;
        t.equal(r.body.error?.code, 'invalid_argument', `fd ${fd}: refused with the error body`);
        t.notMatch(r.text, new RegExp(`${host.config.dataDir}|node_modules|/proc/\\d+`), `fd ${fd}: the refusal names no host path`);
        continue;
      }
      outcomes.ran++;
      t.equal(r.status, 200, `fd ${fd}: either 400 or 200`);
      t.notMatch(r.body.stdout, /boxhost|node_modules|bh-test/, `fd ${fd} stays in the box`);
      t.notOk(r.body.stdout.includes(host.config.dataDir), `fd ${fd} does not see the host data dir`);
      t.match(r.body.stdout, /\nweb\n$/, `fd ${fd}: it ran in box web (its own /etc/hostname)`);
    }
    t.equal(outcomes.refused + outcomes.ran, 18, `every fd answered (${JSON.stringify(outcomes)})`);
    // Positive control: the same exec with a real directory of the box runs there.
    const control = await exec('alpha', 'web', { command: ['sh', '-c', 'pwd; cat /etc/hostname'], cwd: '/tmp' });
    t.equal(control.body.stdout, '/tmp\nweb\n', 'control: a cwd that exists in the box is used');
  });

  t.test('update: live limits, tags replaced, grace period', async (t) => {
    const u = await host.call('PUT', `${P}/alpha/boxes/web`, { body: { config: { ram_mb: 256 }, tags: { tier: 'back' }, termination_grace_period_seconds: 2 } });
    t.equal(u.status, 200);
    t.same(u.body.tags, { tier: 'back' });
    t.equal(u.body.config.ram_mb, 256);
    t.equal(u.body.config.cpus, 1, 'fields not given stay');
    t.equal(u.body.termination_grace_period_seconds, 2);
    const limit = (await sh('alpha', 'web', 'cat /sys/fs/cgroup/memory/memory.limit_in_bytes')).stdout.trim();
    t.equal(Number(limit), 256 * 1024 * 1024, 'memory limit changed live');
    await host.call('PUT', `${P}/alpha/boxes/web`, { body: { config: { cpus: 2 } } });
    const quota = (await sh('alpha', 'web', 'cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us')).stdout.trim().split('\n').map(Number);
    t.equal(quota[0] / quota[1], 2, 'cpus changed live (CFS quota = 2 periods)');
    t.equal((await host.call('GET', `${P}/alpha/boxes/web`)).body.config.ram_mb, 256, 'a later PUT keeps fields it does not name');
    t.equal((await host.call('PUT', `${P}/alpha/boxes/web`, { body: { config: { storage_gb: 5 } } })).status, 400);
    t.equal((await host.call('PUT', `${P}/alpha/boxes/web`, { body: { tags: { n: 1 } } })).status, 400, 'map values are strings');
  });

  t.test('a process past ram_mb is killed; the box stays up', async (t) => {
    await host.call('PUT', `${P}/alpha/boxes/web`, { body: { config: { ram_mb: 64 } } });
    const hog = await sh('alpha', 'web', 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo survived ${#x}');
    t.equal(hog.exit_code, 137, 'OOM-killed');
    t.equal((await sh('alpha', 'web', 'echo alive')).stdout, 'alive\n');
    t.equal((await host.call('GET', `${P}/alpha/boxes/web`)).body.status, 'running');
    await host.call('PUT', `${P}/alpha/boxes/web`, { body: { config: { ram_mb: 512 } } });
  });

  t.test('fork carries files; deleting the source keeps the fork', async (t) => {
    await sh('alpha', 'web', 'echo carried > /root/note');
    const fork = await create('alpha', { name: 'web-copy', fork: 'web' });
    t.equal(fork.status, 200, fork.text);
    t.equal(fork.body.status, 'running');
    t.equal(fork.body.fork, 'web');
    t.equal((await sh('alpha', 'web-copy', 'cat /root/note')).stdout, 'carried\n');
    // Its source's environment comes with it (its tags do not), in the row and in the box.
    t.same(fork.body.environment, { GREETING: "it's me" });
    t.same(fork.body.tags, {});
    t.match((await sh('alpha', 'web-copy', 'cat /etc/boxes-env')).stdout, /GREETING=/);
    await sh('alpha', 'web-copy', 'echo mine > /root/note');
    t.equal((await sh('alpha', 'web', 'cat /root/note')).stdout, 'carried\n', 'the source is untouched');
    // Deleting a source whose snapshot a fork depends on neither fails nor breaks the fork.
    t.equal((await create('alpha', { name: 'tmp-src' })).body.status, 'running');
    await sh('alpha', 'tmp-src', 'echo from-src > /root/keep');
    const own = await create('alpha', { name: 'tmp-fork', fork: 'tmp-src', environment: { MINE: '1' } });
    t.equal(own.body.status, 'running');
    t.same(own.body.environment, { MINE: '1' }, "the request's environment over its source's (none)");
    t.equal((await host.call('DELETE', `${P}/alpha/boxes/tmp-src?wait=30`)).status, 204, 'source deleted');
    t.equal((await sh('alpha', 'tmp-fork', 'cat /root/keep')).stdout, 'from-src\n', 'the fork keeps its files');
    await host.call('POST', `${P}/alpha/boxes/tmp-fork/stop?wait=30`);
    t.equal((await host.call('POST', `${P}/alpha/boxes/tmp-fork/resume?wait=30`)).body.status, 'running', 'and still starts');
    t.equal((await host.call('DELETE', `${P}/alpha/boxes/tmp-fork?wait=30`)).status, 204);
    t.equal((await create('alpha', { name: 'bad-fork', fork: 'nope' })).status, 400);
    t.equal((await create('alpha', { name: 'bad-fork', fork: 'web@nosnap' })).status, 400);
  });

  t.test('stop, resume and the 409s', async (t) => {
    const stopped = await host.call('POST', `${P}/alpha/boxes/web/stop?wait=30`);
    t.equal(stopped.status, 200);
    t.equal(stopped.body.status, 'stopped');
    t.equal((await host.call('POST', `${P}/alpha/boxes/web/stop`)).status, 409, 'stop a stopped box');
    t.equal((await exec('alpha', 'web', { command: ['true'] })).status, 409, 'exec needs running');
    const resumed = await host.call('POST', `${P}/alpha/boxes/web/resume?wait=30`);
    t.equal(resumed.body.status, 'running');
    t.equal((await sh('alpha', 'web', 'cat /root/note')).stdout, 'carried\n', 'files survive stop/resume');
    t.equal((await host.call('POST', `${P}/alpha/boxes/web/resume`)).status, 409, 'resume a running box');
    // Queued behind a stop, a resume is fine and a second stop is not.
    const s = await host.call('POST', `${P}/alpha/boxes/web/stop`);
    t.equal(s.status, 202);
    const r = await host.call('POST', `${P}/alpha/boxes/web/resume`);
    t.equal(r.status, 202);
    t.equal((await host.call('POST', `${P}/alpha/boxes/web/resume`)).status, 409);
    const done = await host.call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=30`);
    t.equal(done.body.status, 'succeeded');
    t.equal((await host.call('GET', `${P}/alpha/boxes/web`)).body.status, 'running');
  });

  t.test('boxes of one project reach each other; other projects and host ports are out of reach', async (t) => {
    t.equal((await create('alpha', { name: 'peer' })).body.status, 'running');
    t.equal((await create('beta', { name: 'stranger' })).body.status, 'running');
    const web = (await host.call('GET', `${P}/alpha/boxes/web`)).body;
    await exec('alpha', 'web', { command: ['sh', '-c', 'while true; do echo pong | nc -l -p 7070; done'], no_hup: true });
    await new Promise((r) => setTimeout(r, 300));
    const same = await sh('alpha', 'peer', `echo ping | timeout 3 nc ${web.address} 7070`);
    t.equal(same.stdout.trim(), 'pong', 'same project connects');
    const other = await sh('beta', 'stranger', `echo ping | timeout 3 nc ${web.address} 7070`);
    t.not(other.stdout.trim(), 'pong', 'another project cannot connect');
    // Control: the stranger's own network works (it answers the host, over its eth0), so its
    // silence above is the isolation's, not a box with no network.
    const stranger = (await host.call('GET', `${P}/beta/boxes/stranger`)).body;
    await exec('beta', 'stranger', { command: ['sh', '-c', 'while true; do echo pong | nc -l -p 7071; done'], no_hup: true });
    const strangerAnswers = async () =>
      new Promise<string>((resolve) => {
        let got = '';
        const c = net.connect(7071, stranger.address, () => c.write('ping\n'));
        c.on('data', (b) => (got += b));
        c.on('close', () => resolve(got));
        c.on('error', () => resolve(got));
        setTimeout(() => c.destroy(), 3000);
      });
    let fromStranger = await strangerAnswers();
    // A refused connect fails at once (the listener may not be up yet): tries are spaced out.
    for (let i = 0; i < 40 && fromStranger.trim() !== 'pong'; i++) {
      await new Promise((r) => setTimeout(r, 250));
      fromStranger = await strangerAnswers();
    }
    t.equal(fromStranger.trim(), 'pong', 'control: the stranger box has a working network');

    const server = net.createServer((s) => s.end('host-secret\n'));
    await new Promise<void>((r) => server.listen(0, '0.0.0.0', () => r()));
    t.teardown(() => new Promise((r) => server.close(r)));
    const port = (server.address() as net.AddressInfo).port;
    const gateway = web.address.replace(/\.\d+$/, '.1');
    // Control: the service answers on that very address (from the host), so a box's silence is the firewall's.
    const fromItself = await new Promise<string>((resolve) => {
      let got = '';
      const c = net.connect(port, gateway, () => c.end());
      c.on('data', (b) => (got += b));
      c.on('close', () => resolve(got));
      c.on('error', () => resolve(got));
      c.setTimeout(3000, () => c.destroy());
    });
    t.equal(fromItself, 'host-secret\n', 'control: the host service answers on the gateway address');
    const toHost = await sh('alpha', 'peer', `echo hi | timeout 3 nc ${gateway} ${port}`);
    t.notMatch(toHost.stdout, /host-secret/, 'a host service is out of reach');
    // The host can open a connection into a box (what publishing needs).
    const fromHost = await new Promise<string>((resolve) => {
      const c = net.connect(7070, web.address, () => c.write('ping\n'));
      let got = '';
      c.on('data', (b) => (got += b));
      c.on('close', () => resolve(got));
      c.on('error', () => resolve(got));
      setTimeout(() => c.destroy(), 3000);
    });
    t.equal(fromHost.trim(), 'pong');
  });

  t.test('list: project, -, prefix, tag, pagination', async (t) => {
    await host.call('PUT', `${P}/alpha/boxes/peer`, { body: { tags: { tier: 'back', team: 'b' } } });
    const all = (await host.call('GET', `${P}/-/boxes`)).body;
    t.same(all.boxes.map((b: any) => `${b.project}/${b.name}`), ['alpha/peer', 'alpha/web', 'alpha/web-copy', 'beta/stranger']);
    t.equal(all.has_more, false);
    t.equal(all.next_continuation_token, null);
    t.same((await host.call('GET', `${P}/beta/boxes`)).body.boxes.map((b: any) => b.name), ['stranger']);
    t.same((await host.call('GET', `${P}/alpha/boxes?prefix=web`)).body.boxes.map((b: any) => b.name), ['web', 'web-copy']);
    t.same((await host.call('GET', `${P}/alpha/boxes?tag=tier=back`)).body.boxes.map((b: any) => b.name), ['peer', 'web']);
    t.same((await host.call('GET', `${P}/alpha/boxes?tag=tier=back,team=b`)).body.boxes.map((b: any) => b.name), ['peer']);
    t.same((await host.call('GET', `${P}/alpha/boxes?tag=team`)).body.boxes.map((b: any) => b.name), ['peer']);
    for (const inherited of ['constructor', 'toString', '__proto__']) {
      t.same((await host.call('GET', `${P}/alpha/boxes?tag=${inherited}`)).body.boxes, [], `tag=${inherited} is a tag like any other (no box has it)`);
    }
    t.same((await host.call('GET', `${P}/empty/boxes`)).body, { boxes: [], has_more: false, next_continuation_token: null });

    const seen: string[] = [];
    let token: string | null = null;
    let pages = 0;
    do {
      const q: string = `max_results=1${token ? `&continuation_token=${token}` : ''}`;
      const page: any = (await host.call('GET', `${P}/-/boxes?${q}`)).body;
      seen.push(...page.boxes.map((b: any) => b.name));
      token = page.next_continuation_token;
      t.equal(page.has_more, token !== null);
      pages++;
    } while (token && pages < 10);
    t.same(seen, ['peer', 'web', 'web-copy', 'stranger'], 'pages in order, last page full but has_more false');
    t.equal((await host.call('GET', `${P}/-/boxes?max_results=1001`)).status, 400);
    t.equal((await host.call('GET', `${P}/-/boxes?max_results=-1`)).status, 400);
    t.equal((await host.call('GET', `${P}/-/boxes?continuation_token=garbage`)).status, 400);

    const limited = await host.call('POST', '/v1/tokens', { body: { name: 'beta-only', projects: ['beta'] } });
    const tok = limited.body.token;
    t.same((await host.call('GET', `${P}/-/boxes`, { token: tok })).body.boxes.map((b: any) => b.name), ['stranger'], 'a limited token sees its projects only');
    t.equal((await host.call('GET', `${P}/alpha/boxes/web`, { token: tok })).status, 404);
    t.equal((await host.call('POST', `${P}/alpha/boxes/web/stop`, { token: tok })).status, 404);
    t.equal((await host.call('GET', `${P}/alpha/boxes`, { token: tok })).status, 404, 'another project is 404 (DESIGN.md §6)');
    const sneaky = await host.call('POST', `${P}/alpha/boxes`, { token: tok, body: { name: 'sneaky' } });
    t.equal(sneaky.status, 404, 'creating in another project is 404 too: the project is not there for this token');
    t.same(sneaky.body, { error: { code: 'not_found', message: 'project alpha not found', details: [] } });
    t.equal((await host.db('boxes').where({ project: 'alpha', name: 'sneaky' })).length, 0, 'and nothing was made');
  });

  t.test('create rules; bad input leaves nothing behind', async (t) => {
    const before = { rows: await host.db('boxes').count({ n: '*' }), ops: await host.db('operations').count({ n: '*' }), zfs: await zfsList() };
    const cases: [object, number, string][] = [
      [{ name: 'Bad_Name' }, 400, 'name'],
      [{ name: 'a--b' }, 400, 'name'],
      [{ name: 'web' }, 409, ''],
      [{ name: 'x1', base: 'no-such-base' }, 400, 'base'],
      [{ name: 'x1', config: { region: 'mars' } }, 400, 'config.region'],
      [{ name: 'x1', lifecycle: 'deploy', pack: 'p' }, 400, 'lifecycle'],
      [{ name: 'x1', lifecycle: 'dev' }, 400, 'lifecycle'],
      [{ name: 'x1', pack: 'not-installed' }, 400, 'pack'],
      [{ name: 'x1', config: { cpus: 0 } }, 400, 'config.cpus'],
      [{ name: 'x1', environment: { A: 1 } }, 400, 'environment.A'],
      [{ name: 'x1', data_mounts: [{ name: 'vol', path: '/etc/' }] }, 400, 'data_mounts.0.path'],
      [{ name: 'x1', data_mounts: [{ name: 'vol', path: '/srv' }] }, 400, 'data_mounts.0.name'],
      [{ name: 'x1', base: 'busybox', fork: 'web' }, 400, 'fork'],
      [{ name: 'x1', unknown: true }, 400, 'unknown'],
      // A body's value of another type is refused, never converted (docs/decisions.md).
      [{ name: 'x1', config: { cpus: '1' } }, 400, 'config.cpus'],
      [{ name: 'x1', config: { storage_gb: '1' } }, 400, 'config.storage_gb'],
      [{ name: 'x1', tags: { a: 1 } }, 400, 'tags.a'],
      // Names the box could never start with are refused here, not by its create job.
      [{ name: 'x1', environment: { '1A': 'x' } }, 400, 'environment.1A'],
      [{ name: 'x1', environment: { 'A=B': 'x' } }, 400, 'environment.A=B'],
      [{ name: 'x1', environment: { 'A B': 'x' } }, 400, 'environment.A B'],
      // As are values no process environment can hold.
      [{ name: 'x1', environment: { A: 'x\u0000y' } }, 400, 'environment.A'],
      // Tag names the list filter (tag=a,b=1) could never match.
      [{ name: 'x1', tags: { 'a,b': '1' } }, 400, 'tags.a,b'],
      [{ name: 'x1', tags: { 'c=d': '1' } }, 400, 'tags.c=d'],
    ];
    for (const [body, status, field] of cases) {
      const r = await host.call('POST', `${P}/alpha/boxes`, { body });
      t.equal(r.status, status, `${JSON.stringify(body)} → ${status}`);
      if (field) t.ok(r.body.error.details.some((d: any) => d.field === field), `details name ${field}: ${JSON.stringify(r.body.error.details)}`);
      t.equal(r.body.error.code, status === 400 ? 'invalid_argument' : 'conflict');
    }
    const webBefore = (await host.call('GET', `${P}/alpha/boxes/web`)).body;
    const typed: [string, string, object, string][] = [
      ['PUT', `${P}/alpha/boxes/web`, { termination_grace_period_seconds: '7' }, 'termination_grace_period_seconds'],
      ['PUT', `${P}/alpha/boxes/web`, { config: { ram_mb: '256' } }, 'config.ram_mb'],
      ['POST', `${P}/alpha/boxes/web/exec`, { command: ['true'], tty: 'false' }, 'tty'],
      ['POST', `${P}/alpha/boxes/web/exec`, { command: ['true'], timeout_secs: '5' }, 'timeout_secs'],
      ['POST', `${P}/alpha/boxes/web/publish`, { port: '80' }, 'port'],
      ['POST', `${P}/alpha/boxes/web/stop`, { bogus: 1 }, 'bogus'],
      ['POST', `${P}/alpha/boxes/web/resume`, { bogus: 1 }, 'bogus'],
      ['POST', `${P}/alpha/boxes/web/exec`, { command: ['true'], env: { '1X': '1' } }, 'env.1X'],
      ['POST', `${P}/alpha/boxes/web/services`, { name: 'svc', command: ['sleep', '9'], env: { 'A-B': '1' } }, 'env.A-B'],
      ['POST', `${P}/alpha/boxes/web/exec`, { command: ['true'], env: { X: 'a\u0000b' } }, 'env.X'],
      ['POST', `${P}/alpha/boxes/web/services`, { name: 'svc', command: ['sleep', '9'], env: { X: '\u0000' } }, 'env.X'],
      ['PUT', `${P}/alpha/boxes/web`, { tags: { 'x,y': '1' } }, 'tags.x,y'],
    ];
    for (const [method, path, body, field] of typed) {
      const r = await host.call(method, path, { body });
      t.equal(r.status, 400, `${method} ${path} ${JSON.stringify(body)} → 400`);
      t.match(r.body, { error: { code: 'invalid_argument', details: [{ field }] } });
    }
    // A key __proto__ (JSON.parse makes it an own key; a spread of the object would take it as
    // the prototype) is refused wherever it is, not passed over.
    for (const raw of ['{"name":"x1","__proto__":{"a":1}}', '{"name":"x1","tags":{"__proto__":"x"}}', '{"name":"x1","config":{"__proto__":{"cpus":64}}}']) {
      const r = await host.call('POST', `${P}/alpha/boxes`, { raw });
      t.equal(r.status, 400, raw);
      t.match(r.body, { error: { code: 'invalid_argument', details: [{ field: 'body', issue: 'holds a key named __proto__' }] } });
    }
    t.equal((await host.call('GET', `${P}/alpha/boxes/x1`)).status, 404, 'no box x1 was made by any refused call');
    const webAfter = (await host.call('GET', `${P}/alpha/boxes/web`)).body;
    t.same([webAfter.status, webAfter.publishes, webAfter.config, webAfter.termination_grace_period_seconds], [webBefore.status, webBefore.publishes, webBefore.config, webBefore.termination_grace_period_seconds], 'the refused calls changed nothing');
    // A query whose percent-encoding is broken is refused, not taken as its raw text.
    for (const q of ['tag=%zz', 'prefix=%E0%A4%A', 'tag=a%C3%28']) {
      const r = await host.call('GET', `${P}/alpha/boxes?${q}`);
      t.equal(r.status, 400, `?${q} → 400`);
      t.same(r.body, { error: { code: 'invalid_argument', message: 'the query is not valid percent-encoding', details: [{ field: 'query', issue: 'is not valid percent-encoded UTF-8' }] } });
    }
    t.equal((await host.call('GET', `${P}/alpha/boxes?tag=a%3Db&prefix=w%65`)).status, 200, 'well-formed escapes still pass');
    t.same(await host.db('operations').count({ n: '*' }), before.ops, 'no operation row for any refused create');
    t.same(await host.db('boxes').count({ n: '*' }), before.rows, 'nor a box row');
    const pinned = (await host.call('GET', `${P}/alpha/boxes/web`)).body.base;
    t.equal((await create('alpha', { name: 'pinned', base: pinned })).body.status, 'running', 'name@version works');
    await host.call('DELETE', `${P}/alpha/boxes/pinned?wait=30`);
    t.same(await host.db('boxes').count({ n: '*' }), before.rows, 'no rows left');
    t.equal(await zfsList(), before.zfs, 'no datasets left');
  });

  t.test('a create that fails ends failed, cleaned up, and can be deleted', async (t) => {
    const src = (await host.call('GET', `${P}/alpha/boxes/peer`)).body;
    // Break the source under the host: its dataset vanishes, so a fork of it cannot be made.
    t.equal((await host.call('POST', `${P}/alpha/boxes/peer/stop?wait=60`)).body?.status, 'stopped', 'the source is stopped');
    const ds = (await zfsList()).split('\n').find((l) => l.endsWith(boxRoot(src.id)));
    if (!ds) throw new Error(`no root dataset for ${src.id}`);
    t.ok(await moveDataset(ds, `${ds}-moved`), "the source's root is moved aside");
    // A stop and a resume queued behind the create (judged on the running it was to end in).
    const asked = await host.call('POST', `${P}/alpha/boxes`, { body: { name: 'doomed', fork: 'peer' } });
    t.equal(asked.status, 202);
    const queuedStop = await host.call('POST', `${P}/alpha/boxes/doomed/stop`);
    const queuedResume = await host.call('POST', `${P}/alpha/boxes/doomed/resume`);
    t.same([queuedStop.status, queuedResume.status], [202, 202], 'queued behind the create');
    const waitOp = async (r: { headers: Headers }) => (await host.call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=90`)).body;
    t.equal((await waitOp(asked)).status, 'failed');
    t.equal((await waitOp(queuedStop)).status, 'failed', 'the stop is refused: the box failed');
    const late = await waitOp(queuedResume);
    t.equal(late.status, 'failed', 'and so is the resume: the failed create left no root to start');
    t.match(late.error, /nothing to start/);
    const r = await host.call('GET', `${P}/alpha/boxes/doomed`);
    t.equal(r.body.status, 'failed');
    t.match(r.body.error, /^create failed/, 'the box keeps the reason its create failed');
    t.match(r.body.error, /create failed/);
    t.notOk((await zfsList()).includes(boxRoot(r.body.id)), 'no dataset for the failed box');
    const containers = (await run(['runc', '--root', `${host.config.dataDir}/runc`, 'list', '-q'])).stdout;
    t.notOk(containers.includes(r.body.id), 'no container for the failed box');
    const again = await host.call('POST', `${P}/alpha/boxes/doomed/resume`);
    t.equal(again.status, 409, 'a box that failed at create has nothing to resume');
    t.match(again.body.error.message, /failed while it was being created .*delete it and create it again/);
    const del = await host.call('DELETE', `${P}/alpha/boxes/doomed?wait=30`);
    t.equal(del.status, 204);
    t.equal((await host.call('GET', `${P}/alpha/boxes/doomed`)).status, 404);

    // The source, its root gone, fails to resume; once its root is back, a resume brings it
    // back (a failed box is started again, as lxc start does with an errored instance).
    const broken = await host.call('POST', `${P}/alpha/boxes/peer/resume?wait=90`);
    t.equal(broken.body.status, 'failed', broken.text);
    t.match(broken.body.error, /^resume failed/);
    t.ok(await moveDataset(`${ds}-moved`, ds), 'and moved back');
    await run(['zfs', 'mount', ds], { allowFailure: true, lockFile: ZFS_FUSE_MOUNT_LOCK });
    const back = await host.call('POST', `${P}/alpha/boxes/peer/resume?wait=60`);
    t.equal(back.status, 200, back.text);
    t.equal(back.body.status, 'running');
    t.equal(back.body.error, null, 'the error is cleared');
    t.equal((await sh('alpha', 'peer', 'true')).exit_code, 0, 'and it serves');

    // A box failed with its container still up (a stop that did not end): a resume stops it
    // first and starts it afresh, so nothing of the old container stays.
    t.equal((await host.call('POST', `${P}/alpha/boxes/peer/exec`, { body: { command: ['sleep', '4242'], no_hup: true } })).status, 200);
    await host.db('boxes').where({ project: 'alpha', name: 'peer' }).update({ status: 'failed', error: 'stop failed: the container did not stop' });
    const fresh = await host.call('POST', `${P}/alpha/boxes/peer/resume?wait=60`);
    t.equal(fresh.body.status, 'running', fresh.text);
    t.equal((await sh('alpha', 'peer', 'ps -o args | grep -c "^sleep 4242" || true')).stdout.trim(), '0', 'the old container is gone with its processes');
  });

  t.test('delete removes container, network and datasets', async (t) => {
    const box = (await host.call('GET', `${P}/beta/boxes/stranger`)).body;
    const del = await host.call('DELETE', `${P}/beta/boxes/stranger`);
    t.equal(del.status, 202);
    t.equal(del.body.status, 'deleting');
    const early = await host.call('POST', `${P}/beta/boxes`, { body: { name: 'stranger' } });
    t.equal(early.status, 409, 'the name is not free while the delete runs');
    t.match(early.body.error.message, /^box beta\/stranger is being deleted; its name is free once that is done \(GET \/v1\/operations\?project=beta&box=stranger&status=queued,running/);
    const ops = await host.call('GET', '/v1/operations?project=beta&box=stranger');
    t.equal(ops.body.operations[0].id, del.headers.get('operation-id'), "the box's operations, newest first, begin with the delete");
    const op = await host.call('GET', `/v1/operations/${del.headers.get('operation-id')}/wait?timeout=30`);
    t.equal(op.body.status, 'succeeded');
    t.equal((await host.call('GET', `${P}/beta/boxes/stranger`)).status, 404);
    t.notOk((await zfsList()).includes(boxRoot(box.id)));
    const netns = (await run(['ip', 'netns', 'list'])).stdout;
    t.notOk(netns.includes(box.id), 'netns gone');
    t.equal((await host.call('DELETE', `${P}/beta/boxes/stranger`)).status, 404);
  });
});

