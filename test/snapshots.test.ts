import path from 'node:path';
import { execFile } from 'node:child_process';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { RuncRuntime } from '../workers/runtime/runc';

/**
 * Box snapshots on real boxes (docs/snapshots.md): take (201, the record; a running box paused
 * for the instant and running after), list, get, the name and description rules, restore (the
 * box runs again with the snapshot's files; 409 naming later snapshots and forks), a fork from
 * `box@snapshot` that outlives its snapshot, a stopped box, delete, the CLI.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

t.test('box snapshots on real boxes', async (t) => {
  // A small snapshot bound, so that the test reaches it.
  const host = await startTestHost(t, { BOXHOST_SNAPSHOTS_MAX_PER_BOX: '3' });
  const P = '/v1/projects/snap/boxes';
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const sh = async (box: string, script: string) => {
    const r = await call('POST', `${P}/${box}/exec`, { command: ['sh', '-c', script] });
    if (r.status !== 200) throw new Error(`exec in ${box}: ${r.status} ${r.text}`);
    return r.body as { stdout: string; stderr: string; exit_code: number };
  };
  const waitOp = async (r: { status: number; headers: Headers; text: string }) => {
    t.equal(r.status, 202, `accepted: ${r.text}`);
    return (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=120`)).body;
  };
  const runtime = new RuncRuntime({ dataDir: host.config.dataDir, hostTag: host.config.hostTag });

  const made = await call('POST', `${P}?wait=120`, { name: 'web' });
  t.equal(made.body.status, 'running', made.text);
  // A process that keeps writing: the snapshot must not leave it frozen.
  await sh('web', 'echo v1 > /root/f');
  const loop = await call('POST', `${P}/web/exec`, { command: ['sh', '-c', 'i=0; while true; do i=$((i+1)); echo $i > /root/tick; sleep 0.05; done'], no_hup: true });
  t.equal(loop.status, 200, loop.text);

  t.test('take: 201 with the record, the box running and not frozen after', async (t) => {
    const r = await call('POST', `${P}/web/snapshots`, { name: 's1', description: 'first one — v1' });
    t.equal(r.status, 201, r.text);
    t.match(r.body, { name: 's1', description: 'first one — v1' });
    t.match(r.body.created_at, ISO);
    t.ok(Number.isInteger(r.body.size_bytes) && r.body.size_bytes >= 0, 'size_bytes is a count');
    t.equal(await runtime.status(made.body.id), 'running', 'the container runs (not paused)');
    const before = (await sh('web', 'cat /root/tick')).stdout;
    await new Promise((r) => setTimeout(r, 300));
    t.not((await sh('web', 'cat /root/tick')).stdout, before, 'its processes go on');
    t.equal((await call('GET', `${P}/web`)).body.status, 'running');

    const again = await call('POST', `${P}/web/snapshots`, { name: 's1' });
    t.equal(again.status, 409, 'a name in use');
    t.equal(again.body.error.code, 'conflict');
    for (const bad of [{ name: 'S1' }, { name: 'a--b' }, { name: '-a' }, { name: '' }, {}, { name: 'ok', description: 'two\nlines' }, { name: 'ok', description: 'x'.repeat(201) }, { name: 'ok', extra: 1 }]) {
      const res = await call('POST', `${P}/web/snapshots`, bad);
      t.equal(res.status, 400, `400 for ${JSON.stringify(bad).slice(0, 60)}`);
      t.equal(res.body.error.code, 'invalid_argument');
    }
    t.equal((await call('POST', `${P}/nope/snapshots`, { name: 'x' })).status, 404, 'an unknown box');
    t.equal((await call('GET', `${P}/nope/snapshots`)).status, 404);
  });

  t.test('list and get', async (t) => {
    const l = await call('GET', `${P}/web/snapshots`);
    t.equal(l.status, 200);
    t.same(l.body.snapshots.map((s: any) => s.name), ['s1']);
    t.same(Object.keys(l.body.snapshots[0]).sort(), ['created_at', 'description', 'name', 'size_bytes']);
    const g = await call('GET', `${P}/web/snapshots/s1`);
    t.equal(g.status, 200);
    t.same(g.body, l.body.snapshots[0]);
    const missing = await call('GET', `${P}/web/snapshots/none`);
    t.equal(missing.status, 404);
    t.equal(missing.body.error.code, 'not_found');
    // Another project's token sees nothing of it.
    const other = (await call('POST', '/v1/tokens', { name: 'other-snap', projects: ['other'] })).body.token;
    t.equal((await host.call('GET', `${P}/web/snapshots`, { token: other })).status, 404, "another project's token: 404");
    t.equal((await host.call('POST', `${P}/web/snapshots/s1/restore`, { token: other })).status, 404);
    const stray = await call('POST', `${P}/web/snapshots/s1/restore`, { bogus: 1 });
    t.equal(stray.status, 400, 'a restore takes no body field');
    t.same(stray.body.error.details, [{ field: 'bogus', issue: 'is not allowed' }]);
    t.equal((await host.call('DELETE', `${P}/web/snapshots/s1`, { token: other })).status, 404);
  });

  t.test('restore brings the files back and the box runs again', async (t) => {
    await sh('web', 'echo v2 > /root/f; echo new > /root/g');
    const done = await waitOp(await call('POST', `${P}/web/snapshots/s1/restore`));
    t.equal(done.status, 'succeeded', JSON.stringify(done));
    t.equal(done.kind, 'box.restore');
    t.equal((await call('GET', `${P}/web`)).body.status, 'running');
    t.equal((await sh('web', 'cat /root/f')).stdout, 'v1\n', 'the snapshot\'s content');
    t.equal((await sh('web', 'test -e /root/g; echo $?')).stdout, '1\n', 'a file made after it is gone');
    t.equal((await call('POST', `${P}/web/snapshots/none/restore`)).status, 404, 'an unknown snapshot');
  });

  t.test('later snapshots and forks block a restore, named; a fork outlives its snapshot', async (t) => {
    await sh('web', 'echo v3 > /root/f');
    t.equal((await call('POST', `${P}/web/snapshots`, { name: 's2' })).status, 201);
    const blocked = await call('POST', `${P}/web/snapshots/s1/restore`);
    t.equal(blocked.status, 409, blocked.text);
    t.match(blocked.body.error.message, /snapshot s2/);
    t.same(blocked.body.error.details, [{ field: 'snapshot', issue: 'snapshot s2 depends on the state after s1' }]);
    t.equal((await call('GET', `${P}/web`)).body.status, 'running', 'nothing was queued');

    // A fork of web@s2 holds s2's files, and keeps them after s2 is deleted.
    const fork = await call('POST', `${P}?wait=120`, { name: 'from-s2', fork: 'web@s2' });
    t.equal(fork.body.status, 'running', fork.text);
    t.equal((await sh('from-s2', 'cat /root/f')).stdout, 'v3\n');
    const delS2 = await call('DELETE', `${P}/web/snapshots/s2`);
    t.equal(delS2.status, 204, delS2.text);
    t.equal((await call('DELETE', `${P}/web/snapshots/s2`)).status, 404, 'gone');
    t.same((await call('GET', `${P}/web/snapshots`)).body.snapshots.map((s: any) => s.name), ['s1']);
    t.equal((await sh('from-s2', 'cat /root/f')).stdout, 'v3\n', 'the fork still has its files');
    t.equal((await call('POST', `${P}?wait=120`, { name: 'late', fork: 'web@s2' })).status, 400, 'a deleted snapshot cannot be forked');

    // s2 is deleted, but the fork made from it still needs its blocks, and they lie after s1.
    const byFork = await call('POST', `${P}/web/snapshots/s1/restore`);
    t.equal(byFork.status, 409, byFork.text);
    t.match(byFork.body.error.message, /fork from-s2/);
    t.equal((await call('DELETE', `${P}/from-s2?wait=120`)).status, 204);
    const done = await waitOp(await call('POST', `${P}/web/snapshots/s1/restore`));
    t.equal(done.status, 'succeeded', 'with the fork gone, the restore goes through');
    t.equal((await sh('web', 'cat /root/f')).stdout, 'v1\n');
  });

  t.test('a stopped box: snapshot, and a restore that brings it back running', async (t) => {
    t.equal((await call('POST', `${P}/web/stop?wait=120`)).body.status, 'stopped');
    const r = await call('POST', `${P}/web/snapshots`, { name: 'cold' });
    t.equal(r.status, 201, r.text);
    t.equal((await call('GET', `${P}/web`)).body.status, 'stopped', 'still stopped');
    const done = await waitOp(await call('POST', `${P}/web/snapshots/cold/restore`));
    t.equal(done.status, 'succeeded');
    t.equal((await call('GET', `${P}/web`)).body.status, 'running');
    t.equal((await sh('web', 'cat /root/f')).stdout, 'v1\n');
  });

  t.test('the CLI', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'snap', XDG_CONFIG_HOME: host.config.dataDir };
    const box = (...args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }));
      });
    await sh('web', 'echo cli-before > /root/f');
    const c = await box('snapshot', 'create', 'web', 'cli1', '-d', 'from the cli');
    t.equal(c.code, 0, c.stderr);
    t.match(c.stdout, /snapshot cli1 of box web taken/);
    const ls = await box('snapshot', 'ls', 'web');
    t.match(ls.stdout, /cli1 .*from the cli/);
    const js = JSON.parse((await box('--json', 'snapshot', 'get', 'web', 'cli1')).stdout);
    t.match(js, { name: 'cli1', description: 'from the cli' });
    await sh('web', 'echo cli-after > /root/f');
    const rs = await box('snapshot', 'restore', 'web', 'cli1', '--wait');
    t.equal(rs.code, 0, rs.stderr);
    t.equal((await sh('web', 'cat /root/f')).stdout, 'cli-before\n');
    const taken = await box('snapshot', 'create', 'web', 'cli1');
    t.equal(taken.code, 1, 'a name in use: exit 1');
    t.match(taken.stderr, /already has a snapshot cli1/);
    t.equal((await box('snapshot', 'rm', 'web', 'cli1')).code, 0);
    t.notMatch((await box('snapshot', 'ls', 'web')).stdout, /cli1/);
  });

  t.test('a box keeps at most BOXHOST_SNAPSHOTS_MAX_PER_BOX snapshots', async (t) => {
    const have = (await call('GET', `${P}/web/snapshots`)).body.snapshots.length;
    for (let i = have; i < 3; i++) t.equal((await call('POST', `${P}/web/snapshots`, { name: `fill${i}` })).status, 201, `snapshot ${i + 1} of 3`);
    const over = await call('POST', `${P}/web/snapshots`, { name: 'one-more' });
    t.equal(over.status, 409, over.text);
    t.match(over.body.error.message, /has 3 snapshots, the most a box keeps/);
    t.equal((await call('GET', `${P}/web/snapshots`)).body.snapshots.length, 3, 'nothing was taken');
  });

  t.test('snapshots go with their box', async (t) => {
    const del = await call('DELETE', `${P}/web?wait=120`);
    t.equal(del.status, 204, del.text);
    t.equal((await call('GET', `${P}/web/snapshots`)).status, 404);
  });
});
