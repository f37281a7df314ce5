import fs from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { startWorkerProcess, killWorker as killed } from './helpers/workerProcess';
import { sleep } from '../core/command';
import { pruneOperations } from '../domain/operations';

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 30000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

t.test('operations on real Redis with a worker process', async (t) => {
  const host = await startTestHost(t, {}, { roles: ['api'] });
  const dir = fs.mkdtempSync(path.join(host.config.dataDir, 'jobs-'));
  let worker = await startWorkerProcess(host);
  t.teardown(() => killed(worker));
  const enqueue = (kind: string, payload: unknown, extra: { boxId?: string; attempts?: number; project?: string; resource?: string } = {}) =>
    host.db.transaction((trx) => host.api!.queue.enqueue(trx, { kind, payload }, { resource: `/v1/test/${kind}`, node: host.config.nodeId, ...extra }));

  t.test('lifecycle, progress, wait and 408', async (t) => {
    // Held running until the test has seen it so (a 1.5 s sleep alone ended before the first
    // look of a loaded suite).
    const op = await enqueue('test.slow', { dir, sleepMs: 0, name: 'life', gate: true });
    t.teardown(() => fs.writeFileSync(path.join(dir, 'life.go'), '')); // let go whatever happens
    const first = await host.call('GET', `/v1/operations/${op.id}`);
    t.equal(first.status, 200);
    t.match(first.body, { id: op.id, kind: 'test.slow', resource: '/v1/test/test.slow', error: null });
    t.ok(['queued', 'running'].includes(first.body.status));
    const running = await until('running', async () => {
      const r = await host.call('GET', `/v1/operations/${op.id}`);
      return r.body.status === 'running' && r.body.progress === 10 && r.body;
    });
    t.equal(running.progress, 10);
    const early = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=0.2`);
    t.equal(early.status, 408);
    t.equal(early.body.error.code, 'timeout');
    fs.writeFileSync(path.join(dir, 'life.go'), '');
    const done = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=30`);
    t.equal(done.status, 200);
    t.equal(done.body.status, 'succeeded');
    t.equal(done.body.progress, 100);
    t.equal((await host.call('GET', '/v1/operations/op_unknown1')).status, 404);
    t.equal((await host.call('GET', `/v1/operations/${op.id}/wait?timeout=301`)).status, 400);
  });

  t.test('retries with exponential backoff, then success', async (t) => {
    const op = await enqueue('test.flaky', { dir, failTimes: 2 });
    const done = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=30`);
    t.equal(done.body.status, 'succeeded');
    const attempts = fs.readFileSync(path.join(dir, 'flaky.attempts'), 'utf8').trim().split('\n').map((l) => l.split(' ').map(Number));
    t.same(attempts.map((a) => a[0]), [1, 2, 3]);
    const gap1 = attempts[1][1] - attempts[0][1];
    const gap2 = attempts[2][1] - attempts[1][1];
    t.ok(gap1 >= 900, `first retry after ${gap1} ms`);
    t.ok(gap2 >= 1800, `second retry after ${gap2} ms (doubled)`);
  });

  t.test('a job that keeps failing ends failed with its reason', async (t) => {
    const op = await enqueue('test.fail', { dir }, { attempts: 2 });
    const done = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=30`);
    t.equal(done.body.status, 'failed');
    t.equal(done.body.error, 'this job always fails');
    t.equal(fs.readFileSync(path.join(dir, 'failed.reason'), 'utf8'), 'this job always fails', 'onFailed ran');
  });

  t.test('operations on one box run one at a time, in arrival order', async (t) => {
    const a = await enqueue('test.slow', { dir, sleepMs: 1000, name: 'order-a' }, { boxId: 'bordertest' });
    const b = await enqueue('test.slow', { dir, sleepMs: 10, name: 'order-b' }, { boxId: 'bordertest' });
    await until('a running', async () => (await host.call('GET', `/v1/operations/${a.id}`)).body.status === 'running');
    t.equal((await host.call('GET', `/v1/operations/${b.id}`)).body.status, 'queued', 'b waits for a');
    t.equal((await host.call('GET', `/v1/operations/${b.id}/wait?timeout=20`)).body.status, 'succeeded');
    const aStart = Number(fs.readFileSync(path.join(dir, 'order-a.starts'), 'utf8').split(' ')[2]);
    const bStart = Number(fs.readFileSync(path.join(dir, 'order-b.starts'), 'utf8').split(' ')[2]);
    const aDone = fs.statSync(path.join(dir, 'order-a.done')).mtimeMs;
    t.ok(bStart >= aDone - 5 && bStart > aStart, 'b started after a finished');
  });

  t.test('a worker killed mid-job: the job finishes after restart', async (t) => {
    const op = await enqueue('test.slow', { dir, sleepMs: 4000, name: 'killed' });
    await until('started', async () => fs.existsSync(path.join(dir, 'killed.starts')));
    const firstPid = worker.pid;
    await killed(worker);
    t.notOk(fs.existsSync(path.join(dir, 'killed.done')), 'killed before it finished');
    worker = await startWorkerProcess(host);
    const done = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=60`);
    t.equal(done.body.status, 'succeeded');
    const starts = fs.readFileSync(path.join(dir, 'killed.starts'), 'utf8').trim().split('\n');
    t.equal(starts.length, 2, 'run again once');
    t.equal(Number(starts[0].split(' ')[1]), firstPid);
    t.equal(Number(fs.readFileSync(path.join(dir, 'killed.done'), 'utf8')), worker.pid, 'finished by the new worker');
  });

  t.test('the list: newest first, filters, pages, a limited token sees its projects only, old finished ones dropped', async (t) => {
    const a1 = await enqueue('test.slow', { dir, sleepMs: 10, name: 'list-a1' }, { project: 'opla', resource: '/v1/projects/opla/boxes/web', boxId: 'bopla1' });
    const a2 = await enqueue('test.fail', { dir }, { project: 'opla', attempts: 1, resource: '/v1/projects/opla/boxes/db' });
    const b1 = await enqueue('test.slow', { dir, sleepMs: 10, name: 'list-b1' }, { project: 'oplb', resource: '/v1/projects/oplb/boxes/web' });
    for (const op of [a1, a2, b1]) await host.call('GET', `/v1/operations/${op.id}/wait?timeout=30`);

    const all = await host.call('GET', '/v1/operations?max_results=1000');
    t.equal(all.status, 200);
    const ids = all.body.operations.map((o: { id: string }) => o.id);
    t.same(ids.slice(0, 3), [b1.id, a2.id, a1.id], 'newest first');
    t.match(all.body.operations[1], { id: a2.id, kind: 'test.fail', status: 'failed', error: 'this job always fails', resource: '/v1/projects/opla/boxes/db' });
    t.equal(all.body.has_more, false);
    t.equal(all.body.next_continuation_token, null);

    const ofA = await host.call('GET', '/v1/operations?project=opla');
    t.same(ofA.body.operations.map((o: { id: string }) => o.id), [a2.id, a1.id]);
    const failedA = await host.call('GET', '/v1/operations?project=opla&status=failed');
    t.same(failedA.body.operations.map((o: { id: string }) => o.id), [a2.id]);
    const both = await host.call('GET', '/v1/operations?project=opla&status=queued,running,succeeded');
    t.same(both.body.operations.map((o: { id: string }) => o.id), [a1.id]);
    t.same((await host.call('GET', '/v1/operations?project=opla&kind=test.fail')).body.operations.map((o: { id: string }) => o.id), [a2.id]);
    // A box's operations by its path (it holds no row here: as after its delete).
    t.same((await host.call('GET', '/v1/operations?project=opla&box=web')).body.operations.map((o: { id: string }) => o.id), [a1.id]);
    t.same((await host.call('GET', '/v1/operations?project=oplb&box=web')).body.operations.map((o: { id: string }) => o.id), [b1.id]);

    // Pages: one at a time, back to the first of the project.
    const seen: string[] = [];
    let token: string | null = null;
    do {
      const q: string = `/v1/operations?project=opla&max_results=1${token ? `&continuation_token=${token}` : ''}`;
      const page = await host.call('GET', q);
      t.equal(page.status, 200);
      t.equal(page.body.operations.length, 1);
      seen.push(page.body.operations[0].id);
      token = page.body.has_more ? page.body.next_continuation_token : null;
    } while (token);
    t.same(seen, [a2.id, a1.id]);

    for (const bad of ['status=done', 'status=queued,', 'box=web', 'max_results=1001', 'continuation_token=nope', 'kind=Box%20create', 'project=Bad_Name']) {
      const r = await host.call('GET', `/v1/operations?${bad}`);
      t.equal(r.status, 400, bad);
      t.equal(r.body.error.code, 'invalid_argument', bad);
    }

    const tok = (await host.call('POST', '/v1/tokens', { body: { name: 'opla-reader', projects: ['opla'] } })).body.token;
    const limited = await host.call('GET', '/v1/operations?max_results=1000', { token: tok });
    t.equal(limited.status, 200);
    t.same(limited.body.operations.map((o: { id: string }) => o.id), [a2.id, a1.id], 'only its project: not oplb, not host-wide ones');
    t.equal((await host.call('GET', '/v1/operations?project=oplb', { token: tok })).status, 404);
    t.equal((await host.call('GET', '/v1/operations?project=oplb&box=web', { token: tok })).status, 404);

    // Finished operations past their keeping time go; unfinished ones stay whatever their age.
    const waiting = await enqueue('test.slow', { dir, sleepMs: 3000, name: 'list-keep' }, { project: 'oplc', boxId: 'boplc' });
    const dropped = await pruneOperations(host.api!, 7, Date.now() + 8 * 86_400_000);
    t.ok(dropped >= 3, `dropped ${dropped}`);
    t.equal((await host.call('GET', `/v1/operations/${a1.id}`)).status, 404, 'a finished one is gone');
    t.equal((await host.call('GET', `/v1/operations/${waiting.id}`)).status, 200, 'an unfinished one stays');
    t.equal(await pruneOperations(host.api!, 7), 0, 'none younger than the keeping time');
    t.equal((await host.call('GET', `/v1/operations/${waiting.id}/wait?timeout=30`)).body.status, 'succeeded');
  });
});
