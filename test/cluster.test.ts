import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import t from 'tap';
import { ConnectionOptions, Queue } from 'bullmq';
import { request } from './helpers/host';
import { clusterEnv, freePort, nodeEnv, pgSchema, RoleProcess, startUnprivilegedApi, REDIS } from './helpers/cluster';
import { run, sleep } from '../core/command';
import { loadConfig } from '../core/config';
import { poolOf } from './helpers/hostState';
import { nodeQueueName } from '../jobs/queue';

/**
 * Two nodes on one machine (each its own data dir, pool, runc root, bridges, subnet slice and
 * agent port), one PostgreSQL, one Redis, and one api process running as an unprivileged user
 * with no host tool on its PATH: the api reaches every box only through its node.
 */
t.test('two nodes behind one unprivileged api', async (t) => {
  const shared = clusterEnv(await pgSchema(t));
  const token = shared.BOXHOST_ADMIN_TOKEN;
  const { url, proxyUrl, proc: apiProc } = await startUnprivilegedApi(t, shared);
  const call = (method: string, p: string, body?: unknown, tok: string | null = token) => request(url, method, p, tok, { body });

  // Equal capacities make placement deterministic; n2's agent listens on every address, so
  // the test can show that boxes still cannot reach it.
  // One backup directory for both, as a mounted remote filesystem would be: a volume moves
  // between them by a restore of its backup (docs/data.md "Moving a volume to another node").
  const backupDir = fs.mkdtempSync('/var/tmp/bh-backups-');
  t.teardown(() => fs.rmSync(backupDir, { recursive: true, force: true }));
  const size = { BOXHOST_NODE_CPUS: '4', BOXHOST_NODE_RAM_MB: '4096', BOXHOST_WORKER_CONCURRENCY: '1', BOXHOST_BACKUP_DIR: backupDir };
  const agent2 = await freePort();
  const env1 = nodeEnv(t, shared, 'n1', size);
  const env2 = nodeEnv(t, shared, 'n2', { ...size, BOXHOST_AGENT_HOST: '0.0.0.0', BOXHOST_AGENT_PORT: String(agent2), BOXHOST_AGENT_URL: `http://127.0.0.1:${agent2}` });
  // One after the other: two pools made at the same instant have deadlocked zfs-fuse here
  // (docs/nodes.md, "Known limits").
  const n1 = new RoleProcess('node', env1).start();
  t.teardown(() => n1.kill());
  await n1.waitFor(/node agent listening/, 120_000);
  let n2 = new RoleProcess('node', env2).start();
  t.teardown(() => n2.kill());
  await n2.waitFor(/node agent listening/, 120_000);

  const nodeStatus = async (id: string) => (await call('GET', `/v1/nodes/${id}`)).body?.status;
  const until = async (what: string, fn: () => Promise<boolean>, ms = 30_000) => {
    const deadline = Date.now() + ms;
    while (!(await fn())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await sleep(100);
    }
  };
  await until('both nodes up', async () => (await nodeStatus('n1')) === 'up' && (await nodeStatus('n2')) === 'up', 60_000);

  const create = async (project: string, name: string, extra: object = {}) => {
    const r = await call('POST', `/v1/projects/${project}/boxes?wait=120`, { name, ...extra });
    if (r.status !== 200 || r.body.status !== 'running') throw new Error(`create ${project}/${name}: ${r.status} ${r.text}`);
    return r.body;
  };
  const sh = async (project: string, name: string, script: string, extra: object = {}) => {
    const r = await call('POST', `/v1/projects/${project}/boxes/${name}/exec`, { command: ['sh', '-c', script], ...extra });
    if (r.status !== 200) throw new Error(`exec in ${project}/${name}: ${r.status} ${r.text}`);
    return r.body as { exit_code: number; stdout: string; stderr: string };
  };

  t.test('the api process is unprivileged and has no host tools', async (t) => {
    const status = await run(['cat', `/proc/${apiProc.child.pid}/status`]);
    // setpriv execs node in place: the api's own process.
    const pid = apiProc.child.pid!;
    const uid = /^Uid:\s+(\d+)/m.exec(status.stdout)?.[1];
    t.equal(uid, '65534', `api process ${pid} runs as uid 65534`);
    t.match(/^CapEff:\s+(\S+)/m.exec(status.stdout)?.[1], /^0+$/, 'no effective capabilities');
    const environ = (await run(['cat', `/proc/${pid}/environ`])).stdout.split('\0');
    t.ok(environ.some((e) => /^PATH=[^:]+$/.test(e) && !e.includes('sbin')), 'PATH holds one directory, with only node in it');
  });

  let a1: any, a2: any, a3: any, b1: any;
  t.test('placement: the node with the most free RAM, until both hold boxes', async (t) => {
    a1 = await create('pa', 'a1');
    a2 = await create('pa', 'a2');
    a3 = await create('pa', 'a3');
    b1 = await create('pb', 'b1');
    t.equal(a1.node, 'n1', 'equal room: the lower id');
    t.equal(a2.node, 'n2', 'then the node with more free RAM');
    t.equal(a3.node, 'n1');
    t.equal(b1.node, 'n2');
    const nodes = (await call('GET', '/v1/nodes')).body.nodes;
    t.same(nodes.map((n: any) => [n.id, n.committed.boxes, n.committed.ram_mb]), [['n1', 2, 1024], ['n2', 2, 1024]]);
    t.match(nodes[1], { status: 'up', state: 'active', capacity: { cpus: 4, ram_mb: 4096 }, agent_url: `http://127.0.0.1:${agent2}` });
  });

  t.test('exec reaches a box on each node through the one api', async (t) => {
    t.equal((await sh('pa', 'a1', 'hostname')).stdout, 'a1\n');
    t.equal((await sh('pa', 'a2', 'hostname; cat /etc/hostname')).stdout, 'a2\na2\n');
    const bad = await call('POST', '/v1/projects/pa/boxes/a2/exec', { command: ['true'], cwd: '/nope' });
    t.equal(bad.status, 400, 'a remote exec error keeps its status');
    t.equal(bad.body.error.code, 'invalid_argument');
    const live = await call('PUT', '/v1/projects/pa/boxes/a2', { config: { ram_mb: 256 } });
    t.equal(live.status, 200, 'live limits through the remote agent');
    t.equal((await sh('pa', 'a2', 'cat /sys/fs/cgroup/memory/memory.limit_in_bytes')).stdout.trim(), String(256 * 1024 * 1024));
  });

  t.test('a fork lands on its source node', async (t) => {
    await sh('pa', 'a2', 'echo forked-data > /root/f');
    const fork = await create('pa', 'a2-fork', { fork: 'a2' });
    t.equal(fork.node, 'n2');
    t.equal((await sh('pa', 'a2-fork', 'cat /root/f')).stdout, 'forked-data\n');
  });

  t.test('no path between boxes of different nodes; the agent is out of the boxes\' reach', async (t) => {
    const listen = 'while true; do echo pong | nc -l -p 7070; done';
    await call('POST', '/v1/projects/pa/boxes/a1/exec', { command: ['sh', '-c', listen], no_hup: true });
    await call('POST', '/v1/projects/pb/boxes/b1/exec', { command: ['sh', '-c', listen], no_hup: true });
    await sleep(300);
    const same = await sh('pa', 'a3', `echo ping | timeout 3 nc ${a1.address} 7070`);
    t.equal(same.stdout, 'pong\n', 'positive control: a box of pa on n1 reaches another pa box on n1');
    const hostToB1 = await new Promise<string>((resolve) => {
      let got = '';
      const c = net.connect(7070, b1.address, () => c.end('ping\n'));
      c.on('data', (d) => (got += d));
      c.on('close', () => resolve(got));
      c.on('error', () => resolve(got));
      c.setTimeout(3000, () => c.destroy());
    });
    t.equal(hostToB1, 'pong\n', 'positive control: b1 on n2 answers (the host reaches it)');
    const cross = await sh('pb', 'b1', `echo ping | timeout 3 nc ${a1.address} 7070; echo rc=$?`);
    t.notMatch(cross.stdout, /pong/, 'a box of pb on n2 cannot reach a box of pa on n1');
    const back = await sh('pa', 'a1', `echo ping | timeout 3 nc ${b1.address} 7070; echo rc=$?`);
    t.notMatch(back.stdout, /pong/, 'nor the other way');
    const sameProject = await sh('pa', 'a2', `echo ping | timeout 3 nc ${a1.address} 7070; echo rc=$?`);
    t.notMatch(sameProject.stdout, /pong/, 'even boxes of one project on two nodes do not reach each other (no overlay yet: docs/nodes.md)');

    const noSecret = await request(`http://127.0.0.1:${agent2}`, 'GET', '/agent/v1/health', null);
    t.equal(noSecret.status, 401, 'the agent refuses a call without the secret');
    t.equal(noSecret.body.error.code, 'unauthenticated');
    const withSecret = await request(`http://127.0.0.1:${agent2}`, 'GET', '/agent/v1/health', shared.BOXHOST_CLUSTER_SECRET);
    t.equal(withSecret.status, 200, 'positive control: the host reaches it with the secret');
    const gateway2 = b1.address.replace(/\.\d+$/, '.1');
    const fromBox = await sh('pb', 'b1', `printf 'GET /agent/v1/health HTTP/1.0\\r\\n\\r\\n' | timeout 3 nc ${gateway2} ${agent2}; echo rc=$?`);
    t.notMatch(fromBox.stdout, /HTTP\/1/, 'a box cannot open a connection to its node agent');
  });

  t.test("a publish reaches a box on another node through that node's tunnel", async (t) => {
    await sh('pb', 'b1', 'mkdir -p /srv/w && echo from-n2 > /srv/w/index.html');
    const svc = await call('POST', '/v1/projects/pb/boxes/b1/services', { name: 'www', command: ['httpd', '-f', '-p', '8080', '-h', '/srv/w'], port: 8080, publish: { name: 'www' }, ready: { http: '/' } });
    t.equal(svc.status, 201, JSON.stringify(svc.body));
    // The api process (uid nobody) may not dial the box: only its node (root) gets there.
    const rule = ['OUTPUT', '-m', 'owner', '--uid-owner', '65534', '-d', b1.address, '-j', 'REJECT'];
    await run(['iptables', '-I', ...rule]);
    t.teardown(() => run(['iptables', '-D', ...rule], { allowFailure: true }));
    const dial = await run(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'curl', '-sS', '-m', '3', `http://${b1.address}:8080/`], { allowFailure: true });
    t.not(dial.exitCode, 0, 'positive control: uid nobody cannot reach the box itself');
    const get = (host: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const u = new URL(proxyUrl);
        const req = http.get({ host: u.hostname, port: u.port, path: '/', headers: { host } }, (res) => {
          let body = '';
          res.on('data', (c) => (body += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        req.on('error', reject);
      });
    const r = await get('www--b1--pb.localhost');
    t.equal(r.status, 200, r.body);
    t.equal(r.body, 'from-n2\n', "through the proxy of the api process and n2's tunnel");
    const foreign = await new Promise<string>((resolve) => {
      const c = net.connect(agent2, '127.0.0.1', () =>
        c.write(`GET /agent/v1/boxes/${b1.id}/tunnel?address=127.0.0.1&port=${agent2} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${shared.BOXHOST_CLUSTER_SECRET}\r\nConnection: Upgrade\r\nUpgrade: boxhost-tunnel\r\n\r\n`),
      );
      let got = '';
      c.on('data', (d) => (got += d));
      c.on('close', () => resolve(got));
      c.on('error', () => resolve(got));
      c.setTimeout(3000, () => c.destroy());
    });
    t.match(foreign, /^HTTP\/1\.1 400 /, "the agent tunnels only to the box's own address, not one the caller names");
    t.equal((await call('POST', '/v1/projects/pb/boxes/b1/publish', { port: 9, name: 'gap' })).status, 201);
    const gap = await get('gap--b1--pb.localhost');
    t.equal(gap.status, 502, 'nothing on the port: 502 through the tunnel too');
    t.match(JSON.parse(gap.body).error.message, /nothing answers on port 9 in box pb\/b1/);
  });

  // A volume on n2 with a backup, attached to no box: moved to n1 while n2 is lost (below).
  const volumesOn = async (env: Record<string, string>) =>
    (await run(['zfs', 'list', '-H', '-o', 'name', '-r', `${poolOf(loadConfig(env, { readDotenv: false }))}/data`], { allowFailure: true })).stdout.split('\n').filter((l) => /\/data\/v[a-z0-9]+$/.test(l));
  let moveSum = '';
  t.test('a data volume with a backup, for a move', async (t) => {
    // n1 drained for the instant of the create: the volume goes to n2.
    t.equal((await call('PUT', '/v1/nodes/n1', { state: 'draining' })).status, 200);
    const made = await call('POST', '/v1/data', { name: 'mv', size_gb: 1, project: 'pa' });
    t.equal((await call('PUT', '/v1/nodes/n1', { state: 'active' })).status, 200);
    t.equal(made.status, 201, made.text);
    t.equal(made.body.node, 'n2');
    const w = await create('pa', 'mvw', { data_mounts: [{ name: 'mv', path: '/data' }] });
    t.equal(w.node, 'n2', "a box that mounts it is made on the volume's node");
    moveSum = (await sh('pa', 'mvw', 'head -c 4194304 /dev/urandom > /data/blob && sync && sha256sum /data/blob')).stdout.split(' ')[0];
    const b = await call('POST', '/v1/data/mv/backups?wait=120', { name: 'b1' });
    t.equal(b.status, 200, b.text);
    t.match(b.body, { status: 'completed', mode: 'full' });

    const attached = await call('POST', '/v1/data/mv/restore', { backup: 'b1', node: 'n1' });
    t.equal(attached.status, 409, 'attached to a box: no move');
    t.match(attached.body.error.message, /attached to box pa\/mvw on node n2; detach it before moving it to node n1/);
    const noBackup = await call('POST', '/v1/data/mv/restore', { snapshot: 'x', node: 'n1' });
    t.equal(noBackup.status, 400, 'a node goes with a backup only');
    t.equal((await call('POST', '/v1/data/mv/restore', { backup: 'b1', node: 'nope' })).status, 404, 'an unknown node');
    t.equal((await call('POST', '/v1/data/mv/restore', { backup: 'b1', node: 'Bad_Node' })).status, 400);
    const limited = (await call('POST', '/v1/tokens', { name: 'pa-only', projects: ['pa'] })).body;
    const byProject = await call('POST', '/v1/data/mv/restore', { backup: 'b1', node: 'n1' }, limited.token);
    t.equal(byProject.status, 403, 'a project token does not pick nodes');
    t.equal((await volumesOn(env2)).length, 1, 'its dataset is on n2');
    t.equal((await volumesOn(env1)).length, 0);
  });

  t.test('node 2 lost: its boxes answer 503 with why, node 1 carries on; back: converges', async (t) => {
    // Something long-lived in a box of n2, to show nothing in the boxes is lost with the node.
    await call('POST', '/v1/projects/pa/boxes/a2/exec', { command: ['sh', '-c', 'echo $$ > /tmp/sleeper; exec sleep 100000'], no_hup: true });
    await sleep(200);
    const sleeper = (await sh('pa', 'a2', 'cat /tmp/sleeper')).stdout.trim();

    // Frozen, not dead: its heartbeat stops; a stop queued just before stays queued, and says why.
    n2.child.kill('SIGSTOP');
    const stop = await call('POST', '/v1/projects/pb/boxes/b1/stop');
    t.equal(stop.status, 202, 'taken while the heartbeat is still fresh');
    const stopOp = stop.headers.get('operation-id')!;
    const t0 = Date.now();
    const hung = await call('POST', '/v1/projects/pa/boxes/a2/exec', { command: ['true'] });
    t.equal(hung.status, 503, 'an exec into a hung node answers 503');
    t.ok(Date.now() - t0 < 8000, `within seconds (${Date.now() - t0} ms), not at the exec timeout`);
    await until('n2 down', async () => (await nodeStatus('n2')) === 'down', 10_000);
    const op = (await call('GET', `/v1/operations/${stopOp}`)).body;
    t.equal(op.status, 'queued');
    t.match(op.error, /^waiting: node n2 is not answering/);

    await n2.kill('SIGKILL');
    const dead = await call('POST', '/v1/projects/pa/boxes/a2/exec', { command: ['true'] });
    t.equal(dead.status, 503);
    t.match(dead.body.error, { code: 'unavailable', message: /node n2/ });
    const shown = (await call('GET', '/v1/projects/pa/boxes/a2')).body;
    t.equal(shown.status, 'unknown', 'its box does not claim to run');
    t.match(shown.error, /node n2 is not answering.*last known status: running/);
    t.equal((await call('POST', '/v1/projects/pa/boxes/a2/stop')).status, 503, 'a new operation is refused with 503');
    const health = await call('GET', '/healthz', undefined, null);
    t.equal(health.status, 503);
    t.same(health.body.checks.nodes, { n1: 'ok', n2: 'down' }, 'which node is down, not why (public route)');
    const list = (await call('GET', '/v1/projects/pa/boxes')).body.boxes;
    t.same(list.map((b: any) => [b.name, b.status]), [['a1', 'running'], ['a2', 'unknown'], ['a2-fork', 'unknown'], ['a3', 'running'], ['mvw', 'unknown']]);

    t.equal((await sh('pa', 'a1', 'echo still here')).stdout, 'still here\n', 'node 1 boxes keep working');
    const c1 = await create('pa', 'c1');
    t.equal(c1.node, 'n1', 'new boxes go to the node that is up');

    // Its volume moves to n1 by a restore of its backup there, n2 still down: the box of n2 that
    // had it attached (what refused the move while n2 was up) lets go of it.
    const moved = await call('POST', '/v1/data/mv/restore?wait=120', { backup: 'b1', node: 'n1' });
    t.equal(moved.status, 200, moved.text);
    t.same((await call('GET', '/v1/projects/pa/boxes/mvw')).body.data_mounts, [], 'the box on the dead node no longer mounts it');
    t.match(moved.body, { name: 'mv', node: 'n1', attachments: [] }, 'n1 holds the volume now');
    t.equal((await volumesOn(env1)).length, 1, 'its dataset is on n1');
    await create('pa', 'mvr', { data_mounts: [{ name: 'mv', path: '/data' }] });
    t.equal((await sh('pa', 'mvr', 'sha256sum /data/blob')).stdout.split(' ')[0], moveSum, "a box on n1 reads the backup's data, byte for byte");
    const next = await call('POST', '/v1/data/mv/backups?wait=120', { name: 'b2' });
    t.match(next.body, { status: 'completed', mode: 'incremental', parent: 'b1' }, 'its next backup is incremental on the one it came from');

    // While n2 is away, one of its containers dies (as a crash of the machine would leave it).
    const fork = (await call('GET', '/v1/projects/pa/boxes/a2-fork')).body;
    const runcRoot = `${env2.BOXHOST_DATA_DIR}/runc`;
    const cid = (await run(['runc', '--root', runcRoot, 'list', '-q'])).stdout.split('\n').find((l) => l.endsWith(fork.id))!;
    await run(['runc', '--root', runcRoot, 'kill', cid, 'KILL']);
    await sleep(300);
    await run(['runc', '--root', runcRoot, 'delete', '--force', cid]);

    n2 = new RoleProcess('node', env2).start();
    await n2.waitFor(/node agent listening/, 120_000);
    await until('n2 up', async () => (await nodeStatus('n2')) === 'up');
    const done = (await call('GET', `/v1/operations/${stopOp}/wait?timeout=60`)).body;
    t.equal(done.status, 'succeeded', 'the queued stop ran once the node was back');
    t.equal((await call('GET', '/v1/projects/pb/boxes/b1')).body.status, 'stopped');
    t.equal((await call('GET', '/v1/projects/pa/boxes/a2')).body.status, 'running');
    t.equal((await sh('pa', 'a2', `kill -0 ${sleeper} && echo alive`)).stdout, 'alive\n', 'a process of the box lived through its node\'s absence');
    t.equal((await sh('pa', 'a2-fork', 'cat /root/f')).stdout, 'forked-data\n', 'reconciliation started the box that died, with its files');
    const healthy = await call('GET', '/healthz', undefined, null);
    t.equal(healthy.status, 200, JSON.stringify(healthy.body));
    // The box of n2 that had it mounted is restarted (a stop and a resume queued by the move),
    // without the volume; then n2 destroys its old copy.
    await until('the box of n2 restarted without the volume', async () => {
      const box = (await call('GET', '/v1/projects/pa/boxes/mvw')).body;
      if (box.status !== 'running') return false;
      const r = await call('POST', '/v1/projects/pa/boxes/mvw/exec', { command: ['sh', '-c', 'test -e /data/blob && echo mounted || echo gone'] });
      return r.status === 200 && r.body.stdout === 'gone\n';
    }, 60_000);
    t.pass('the box that had it attached on n2 runs again, without it');
    await until("n2 let go of the moved volume's dataset", async () => (await volumesOn(env2)).length === 0, 60_000);
    t.pass('n2, back, destroyed its dataset of the volume that moved away');
    t.equal((await volumesOn(env1)).length, 1, "and n1's is the volume");
    t.equal((await call('DELETE', '/v1/projects/pa/boxes/mvr?wait=120')).status < 300, true);
    t.equal((await call('DELETE', '/v1/projects/pa/boxes/mvw?wait=120')).status < 300, true);
    t.equal((await call('DELETE', '/v1/data/mv')).status, 204);
  });

  t.test('a second worker process on node 1 shares its queue and keeps per-box order', async (t) => {
    const w2 = new RoleProcess('worker', env1).start();
    t.teardown(() => w2.kill());
    await w2.waitFor(/"msg":"taking jobs"/, 60_000);
    const ops: { box: string; id: string; action: string }[] = [];
    for (let round = 0; round < 2; round++) {
      for (const box of ['a1', 'a3', 'c1']) {
        for (const action of ['stop', 'resume']) {
          const r = await call('POST', `/v1/projects/pa/boxes/${box}/${action}`);
          t.equal(r.status, 202, `${box} ${action} queued`);
          ops.push({ box, id: r.headers.get('operation-id')!, action });
        }
      }
    }
    const finished: any[] = [];
    for (const o of ops) finished.push((await call('GET', `/v1/operations/${o.id}/wait?timeout=120`)).body);
    t.ok(finished.every((o) => o.status === 'succeeded'), 'every operation succeeded');
    for (const box of ['a1', 'a3', 'c1']) {
      const mine = ops.map((o, i) => ({ ...o, ended: finished[i].updated_at })).filter((o) => o.box === box);
      const ends = mine.map((o) => o.ended);
      t.same(ends, [...ends].sort(), `${box}: operations ended in the order they arrived`);
      t.equal((await call('GET', `/v1/projects/pa/boxes/${box}`)).body.status, 'running');
    }
    const redis = new URL(REDIS);
    const queue = new Queue(nodeQueueName('n1'), { connection: { host: redis.hostname, port: Number(redis.port || 6379) } as ConnectionOptions, prefix: shared.BOXHOST_REDIS_PREFIX });
    t.teardown(() => queue.close());
    const by = new Set<string>();
    for (const o of ops) by.add(String((await queue.getJob(o.id))?.processedBy));
    t.same([...by].sort(), [`n1:${n1.child.pid}`, `n1:${w2.child.pid}`].sort(), 'both worker processes of n1 ran jobs');
  });
});
