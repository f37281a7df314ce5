import t from 'tap';
import { startTestHost } from './helpers/host';
import { startWorkerProcess, killWorker } from './helpers/workerProcess';
import { run, sleep } from '../core/command';
import { ConnectionOptions, Queue } from 'bullmq';
import { nodeQueueName } from '../jobs/queue';
import { queuePrefix, redisOptions } from '../core/redis';

/** A worker killed in the middle of a create or a delete: after a restart the box converges,
 *  with exactly one of everything (or nothing, for a delete). */
t.test('a worker killed mid-operation converges after restart', async (t) => {
  const host = await startTestHost(t, {}, { roles: ['api'] });
  let worker = await startWorkerProcess(host);
  t.teardown(() => killWorker(worker));
  const P = '/v1/projects/crash/boxes';
  const opStatus = async (id: string) => (await host.db('operations').where({ id }).first()).status as string;
  const killWhenRunning = async (opId: string) => {
    // Poll the db directly: the kill must land while the handler is between its steps.
    for (let i = 0; i < 2000 && (await opStatus(opId)) === 'queued'; i++) await sleep(2);
    await killWorker(worker);
    return opStatus(opId);
  };
  const datasets = async (id: string) => (await run(['zfs', 'list', '-H', '-o', 'name', '-t', 'all'])).stdout.split('\n').filter((l) => l.includes(id));
  const containers = async () => (await run(['runc', '--root', `${host.config.dataDir}/runc`, 'list', '-q'])).stdout;

  for (let round = 0; round < 3; round++) {
    const name = `c${round}`;
    const accepted = await host.call('POST', P, { body: { name } });
    t.equal(accepted.status, 202);
    const opId = accepted.headers.get('operation-id')!;
    const atKill = await killWhenRunning(opId);
    t.comment(`round ${round}: operation was ${atKill} when the worker died`);
    worker = await startWorkerProcess(host);
    const done = await host.call('GET', `/v1/operations/${opId}/wait?timeout=90`);
    t.equal(done.body.status, 'succeeded', `create ${name} converged`);
    const box = (await host.call('GET', `${P}/${name}`)).body;
    t.equal(box.status, 'running');
    t.equal((await host.call('POST', `${P}/${name}/exec`, { body: { command: ['hostname'] } })).body.stdout, `${name}\n`);
    t.equal((await datasets(box.id)).length, 1, 'one root dataset');
    t.equal((await containers()).split('\n').filter((l) => l.includes(box.id)).length, 1, 'one container');
  }

  const box = (await host.call('GET', `${P}/c0`)).body;
  const del = await host.call('DELETE', `${P}/c0`);
  await killWhenRunning(del.headers.get('operation-id')!);
  worker = await startWorkerProcess(host);
  const done = await host.call('GET', `/v1/operations/${del.headers.get('operation-id')}/wait?timeout=90`);
  t.equal(done.body.status, 'succeeded', 'delete converged');
  t.equal((await host.call('GET', `${P}/c0`)).status, 404);
  t.same(await datasets(box.id), [], 'no dataset left');
  t.notOk((await containers()).includes(box.id), 'no container left');

  // An operation whose job Redis lost fails at the next worker start instead of holding its
  // box in `creating` forever; the half-made box is failed, and can be deleted.
  const lost = await host.call('POST', P, { body: { name: 'lost' } });
  const lostOp = lost.headers.get('operation-id')!;
  await killWhenRunning(lostOp);
  const queue = new Queue(nodeQueueName(host.config.nodeId), { connection: redisOptions(host.config) as ConnectionOptions, prefix: queuePrefix(host.config) });
  t.teardown(() => queue.close());
  // The dead worker's lock must lapse before the job can be removed.
  for (let i = 0; i < 50 && (await queue.getJob(lostOp)); i++) {
    await queue.remove(lostOp).catch(() => 0);
    await sleep(200);
  }
  t.notOk(await queue.getJob(lostOp), 'the job is gone from Redis');
  worker = await startWorkerProcess(host);
  const lostDone = await host.call('GET', `/v1/operations/${lostOp}`);
  t.equal(lostDone.body.status, 'failed');
  t.match(lostDone.body.error, /lost/);
  const lostBox = (await host.call('GET', `${P}/lost`)).body;
  t.equal(lostBox.status, 'failed');
  t.match(lostBox.error, /interrupted/);
  t.equal((await host.call('DELETE', `${P}/lost?wait=60`)).status, 204, 'a failed box can be deleted');
  t.same(await datasets(lostBox.id), [], 'nothing of it left');

  // A box marked running whose container vanished behind the host's back is started again.
  const c1 = (await host.call('GET', `${P}/c1`)).body;
  await killWorker(worker);
  await run(['runc', '--root', `${host.config.dataDir}/runc`, 'delete', '--force', (await containers()).split('\n').find((l) => l.includes(c1.id))!]);
  worker = await startWorkerProcess(host);
  t.equal((await host.call('POST', `${P}/c1/exec`, { body: { command: ['echo', 'back'] } })).body.stdout, 'back\n', 'reconciled: running again');
});
