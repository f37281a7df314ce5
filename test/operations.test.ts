import fs from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { startWorkerProcess, killWorker as killed } from './helpers/workerProcess';
import { sleep } from '../core/command';

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
  const enqueue = (kind: string, payload: unknown, extra: { boxId?: string; attempts?: number } = {}) =>
    host.db.transaction((trx) => host.api!.queue.enqueue(trx, { kind, payload }, { resource: `/v1/test/${kind}`, node: host.config.nodeId, ...extra }));

  t.test('lifecycle, progress, wait and 408', async (t) => {
    const op = await enqueue('test.slow', { dir, sleepMs: 1500, name: 'life' });
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
    const done = await host.call('GET', `/v1/operations/${op.id}/wait?timeout=10`);
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
});
