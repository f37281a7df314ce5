import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import t, { type Test } from 'tap';
import pino from 'pino';
import { ConnectionOptions, Queue } from 'bullmq';
import { CallResult, request, startTestHost, testDataDir, testSubnet } from './helpers/host';
import { startWorkerProcess, killWorker, workerExit, WorkerProcess } from './helpers/workerProcess';
import { boxObjects, BoxObjects, hostInventory, NOTHING, RUNNING } from './helpers/hostState';
import { RoleProcess } from './helpers/cluster';
import { cleanupHost } from './helpers/cleanup';
import { makePgSchema, testDbKind } from './helpers/db';
import { run, sleep } from '../core/command';
import { loadConfig } from '../core/config';
import { newBoxId } from '../core/ids';
import { nodeQueueName } from '../jobs/queue';
import { queuePrefix, redisOptions } from '../core/redis';
import { boxesRepo } from '../db/repos/boxes';
import { BoxSteps } from '../workers/boxSteps';
import { RuncRuntime } from '../workers/runtime/runc';
import { createDrivers } from '../workers/setup';
import { settleWithin } from '../core/timeout';

/**
 * A worker killed at each step of a create, a fork and a delete (the test-only seam in
 * workers/boxSteps.ts: BOXHOST_TEST_CRASH_AT names the step the worker process SIGKILLs itself
 * at): the host holds exactly what the steps before made, and after a restart the box converges
 * with exactly one of everything (a create or fork) or nothing at all (a delete).
 */
/**
 * The file runs in two halves, side by side in the suite's first phase (scripts/test.sh), each
 * with its own test host: this file the kills at each step of create, fork and delete (and the
 * tests that use their boxes), test/boxes-crash-more.test.ts the rest
 * (BOXHOST_TEST_CRASH_PART=more).
 * Together they took 7.5 min in one file, the longest of the suite.
 */
const PART = process.env.BOXHOST_TEST_CRASH_PART === 'more' ? 'more' : 'steps';
const inPart = (part: 'steps' | 'more') => PART === part;

t.test(PART === 'steps' ? 'a worker killed at each step of create, fork and delete converges after restart' : 'a worker killed in a snapshot, a restore, a base, a volume copy converges after restart', async (t) => {
  const host = await startTestHost(t, {}, { roles: ['api'] });
  const cfg = host.config;
  let worker: WorkerProcess = await startWorkerProcess(host);
  t.teardown(() => killWorker(worker));
  const P = '/v1/projects';
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const opRow = async (id: string) => host.db('operations').where({ id }).first();
  const boxRow = async (project: string, name: string) => host.db('boxes').where({ project, name }).first();
  const bridgePorts = async (project: string) => {
    const p = await host.db('projects').where({ name: project }).first();
    if (!p) return null;
    const bridge = `bh${cfg.hostTag.slice(0, 4)}p${p.net_index}`;
    if (!fs.existsSync(`/sys/class/net/${bridge}`)) return null;
    return (JSON.parse((await run(['ip', '-j', 'link', 'show', 'master', bridge])).stdout || '[]') as unknown[]).length;
  };
  /** In one line, never throwing: the box's row (its status, error, node, address), the
   *  project's operations and row, whether the worker lives and its data dir is there, the last
   *  warnings of the worker and the api (each cut at 300 characters), every box of the host. */
  const whatHappened = async (project: string, boxId: string | undefined): Promise<string> => {
    try {
      const cut = (x: unknown) => String(x).slice(0, 300);
      const warned = (lines: any[]) => lines.filter((l) => l?.level >= 40).slice(-6).map((l) => cut(`${l.msg}${l.err ? ` (${l.err.message ?? l.err})` : ''}`));
      const workerLines = worker.output.split('\n').filter(Boolean).map((l) => { try { return JSON.parse(l); } catch { return { level: 50, msg: l }; } });
      const box = boxId ? await host.db('boxes').where({ id: boxId }).first() : undefined;
      return JSON.stringify({
        box: box ? { status: box.status, error: box.error, node: box.node, address: box.address } : null,
        ops: (await host.db('operations').where({ project }).orderBy('seq')).map((o: any) => ({ kind: o.kind, status: o.status, error: o.error && cut(o.error), box: o.box_id })),
        project: (await host.db('projects').where({ name: project }).first()) ?? null,
        workerAlive: worker.exitCode === null && worker.signalCode === null,
        runcDirThere: fs.existsSync(path.join(cfg.dataDir, 'runc')),
        worker: warned(workerLines),
        api: warned(host.logs),
        boxesOfHost: (await host.db('boxes').select('project', 'name', 'status')).map((b: any) => `${b.project}/${b.name}:${b.status}`),
      }).slice(0, 4000);
    } catch (e) {
      return `(what happened could not be read: ${String((e as Error | undefined)?.message ?? e)})`;
    }
  };
  const restart = async () => {
    await killWorker(worker);
    worker = await startWorkerProcess(host);
  };

  /** Sends `send` to a worker that dies at `point`; answers once it has died there. */
  const dieAt = async (t: Test, point: string, send: () => Promise<CallResult>) => {
    await killWorker(worker);
    worker = await startWorkerProcess(host, { BOXHOST_TEST_CRASH_AT: point });
    const accepted = await send();
    t.equal(accepted.status, 202, `accepted: ${accepted.text}`);
    // settleWithin clears its timer: a pending sleep(120 s) kept the file's process alive ~100 s
    // past its last test.
    const exit = await settleWithin<unknown>(workerExit(worker), 120_000, 'still alive after 120 s');
    t.same(exit, { code: null, signal: 'SIGKILL' }, `the worker died at ${point}`);
    return { opId: accepted.headers.get('operation-id')!, box: accepted.body };
  };

  /** After the restart: the operation succeeded and the box runs with one of everything. */
  const converged = async (t: Test, opId: string, project: string, name: string, extra: Partial<BoxObjects> = {}) => {
    await restart();
    const done = (await call('GET', `/v1/operations/${opId}/wait?timeout=120`)).body;
    t.equal(done?.status, 'succeeded', `the operation converged: ${JSON.stringify(done)}`);
    const box = (await call('GET', `${P}/${project}/boxes/${name}`)).body;
    t.equal(box.status, 'running', 'the box runs');
    t.same(await boxObjects(cfg, box.id), { ...RUNNING, ...extra }, 'exactly one of everything');
    t.equal((await call('POST', `${P}/${project}/boxes/${name}/exec`, { command: ['hostname'] })).body?.stdout, `${name}\n`, 'and answers an exec');
    t.match(box.address, /^\d+\.\d+\.\d+\.\d+$/, 'with its address');
    return box;
  };

  // Each point, and what the host holds when the worker dies there (a create from the base).
  // 'start:container' dies inside the start, the container up while the network is wired beside
  // it: how far the wiring got is a race, so only the rest is compared there (the restart must
  // still end with exactly one lease, port chain and port of the box). The container's bundle is
  // written beside the clone: at 'createRoot:done' it may be there or not, nothing else of the
  // start is (no container, lease, port or cgroup before the root).
  const createPoints: [string, Partial<BoxObjects>][] = [
    ['createRoot', NOTHING],
    ['createRoot:done', { ...NOTHING, root: 1, netns: 1, userns: 1, bundle: /^[01]$/ } as unknown as Partial<BoxObjects>],
    ['start:container', { ...RUNNING, leases: /^[01]$/, guardElements: /^[03]$/ } as unknown as Partial<BoxObjects>],
    ['start:done', RUNNING],
  ];
  const raced = new Set(['createRoot:done', 'start:container']);
  const held = (t: Test, point: string, got: BoxObjects, expected: Partial<BoxObjects>) =>
    raced.has(point) ? t.match(got, expected, `${point}: the host held what the steps before it made`) : t.same(got, expected, `${point}: the host held what the steps before it made`);

  if (inPart('steps')) t.test('create', async (t) => {
    for (const [i, [point, expected]] of createPoints.entries()) {
      const name = `c${i}`;
      const { opId, box } = await dieAt(t, point, () => call('POST', `${P}/crash/boxes`, { name }));
      t.equal((await opRow(opId)).status, 'running', `${point}: the operation was running`);
      t.equal((await boxRow('crash', name)).status, 'creating', `${point}: the box was creating`);
      held(t, point, await boxObjects(cfg, box.id), expected);
      await converged(t, opId, 'crash', name);
    }
    const boxes = (await call('GET', `${P}/crash/boxes`)).body.boxes;
    t.equal(await bridgePorts('crash'), boxes.length, 'one bridge port per box of the project');
    t.equal(new Set(boxes.map((b: any) => b.address)).size, boxes.length, 'each its own address');
    t.equal((await hostInventory(cfg)).leases.length, boxes.length, 'and no lease more');
  });

  if (inPart('steps')) t.test('fork', async (t) => {
    t.equal((await call('POST', `${P}/crash/boxes?wait=120`, { name: 'src' })).body.status, 'running');
    await call('POST', `${P}/crash/boxes/src/exec`, { command: ['sh', '-c', 'echo from-src > /root/f'] });
    const src = (await call('GET', `${P}/crash/boxes/src`)).body;
    for (const [i, [point, expected]] of createPoints.entries()) {
      const name = `f${i}`;
      const { opId, box } = await dieAt(t, point, () => call('POST', `${P}/crash/boxes`, { name, fork: 'src' }));
      t.equal((await boxRow('crash', name)).status, 'creating', `${point}: the fork was creating`);
      // The fork snapshot on the source comes with the clone.
      held(t, point, await boxObjects(cfg, box.id), { ...expected, forkSnapshots: point === 'createRoot' ? 0 : 1 });
      await converged(t, opId, 'crash', name, { forkSnapshots: 1 });
      t.equal((await call('POST', `${P}/crash/boxes/${name}/exec`, { command: ['cat', '/root/f'] })).body.stdout, 'from-src\n', "the fork holds its source's files");
    }
    // It keeps one `_fork-<id>` snapshot per fork made from it (what each fork's root is a clone of).
    t.same(await boxObjects(cfg, src.id), { ...RUNNING, snapshots: createPoints.length }, 'the source is untouched: running, one snapshot per fork');
  });

  if (inPart('more')) t.test('snapshot and restore', async (t) => {
    const made = await call('POST', `${P}/crashs/boxes?wait=120`, { name: 's' });
    t.equal(made.body.status, 'running', made.text);
    await call('POST', `${P}/crashs/boxes/s/exec`, { command: ['sh', '-c', 'echo one > /root/f'] });
    const runtime = new RuncRuntime({ dataDir: cfg.dataDir, hostTag: cfg.hostTag });

    // Killed in the instant the box is held still for its snapshot: the retry takes the
    // snapshot and thaws the box.
    await killWorker(worker);
    worker = await startWorkerProcess(host, { BOXHOST_TEST_CRASH_AT: 'snapshot:paused' });
    const pending = call('POST', `${P}/crashs/boxes/s/snapshots`, { name: 'one' });
    const exit = await settleWithin<unknown>(workerExit(worker), 60_000, 'still alive after 60 s');
    t.same(exit, { code: null, signal: 'SIGKILL' }, 'the worker died at snapshot:paused');
    t.equal(await runtime.status(made.body.id), 'paused', 'with the box held still');
    await restart();
    const taken = await pending;
    if (taken.status === 202) {
      const op = (await call('GET', `/v1/operations/${taken.headers.get('operation-id')}/wait?timeout=120`)).body;
      t.equal(op.status, 'succeeded', `the snapshot converged: ${JSON.stringify(op)}`);
    } else {
      t.equal(taken.status, 201, taken.text);
    }
    t.equal(await runtime.status(made.body.id), 'running', 'the box runs again (thawed)');
    t.same((await call('GET', `${P}/crashs/boxes/s/snapshots`)).body.snapshots.map((x: any) => x.name), ['one']);

    // Killed with the container stopped and the root not yet rolled back.
    await call('POST', `${P}/crashs/boxes/s/exec`, { command: ['sh', '-c', 'echo two > /root/f'] });
    const { opId } = await dieAt(t, 'restore:stopped', () => call('POST', `${P}/crashs/boxes/s/snapshots/one/restore`));
    t.equal((await boxRow('crashs', 's')).status, 'restoring', 'the box was restoring');
    t.equal(await runtime.status(made.body.id), null, 'its container was stopped');
    await converged(t, opId, 'crashs', 's', { snapshots: 1 });
    t.equal((await call('POST', `${P}/crashs/boxes/s/exec`, { command: ['cat', '/root/f'] })).body.stdout, 'one\n', "the snapshot's files");
  });

  if (inPart('more')) t.test('base save and import', async (t) => {
    const box = (await call('GET', `${P}/crashs/boxes/s`)).body;
    const runtime = new RuncRuntime({ dataDir: cfg.dataDir, hostTag: cfg.hostTag });
    const datasets = async () => (await run(['zfs', 'list', '-H', '-o', 'name', '-t', 'all', '-r', `boxhost-${cfg.hostTag}`])).stdout.split('\n').filter(Boolean);
    // Killed while the box is held still for the save: the retry holds it again, saves, thaws.
    const saved = await dieAt(t, 'base-save:paused', () => call('POST', `${P}/crashs/bases`, { box: 's', name: 'crashbase' }));
    t.equal(await runtime.status(box.id), 'paused', 'the box was held still');
    await restart();
    const op = (await call('GET', `/v1/operations/${saved.opId}/wait?timeout=120`)).body;
    t.equal(op?.status, 'succeeded', `the save converged: ${JSON.stringify(op)}`);
    t.equal(await runtime.status(box.id), 'running', 'the box runs again (thawed)');
    t.ok((await call('GET', '/v1/bases/crashbase')).body.size_bytes > 0, 'the base is made');
    t.notOk((await datasets()).some((d) => /@_save-|\/tmp\/save-/.test(d)), 'no hold or temporary clone is left');

    // Killed as the import starts to unpack: the retry unpacks it again from the staged upload.
    const tarball = (await fetch(`${host.url}/v1/bases/crashbase/export`, { headers: { authorization: `Bearer ${host.adminToken}` } }).then((r) => r.arrayBuffer()));
    const imported = await dieAt(t, 'base-import:start', () => host.call('POST', '/v1/bases/import?name=crashimport', { raw: Buffer.from(tarball), contentType: 'application/x-tar' }));
    await restart();
    const op2 = (await call('GET', `/v1/operations/${imported.opId}/wait?timeout=120`)).body;
    t.equal(op2?.status, 'succeeded', `the import converged: ${JSON.stringify(op2)}`);
    t.same(fs.readdirSync(path.join(cfg.dataDir, 'imports')), [], 'the staged upload is gone');
    const made = await call('POST', `${P}/crashs/boxes?wait=120`, { name: 'fromimport', base: 'crashimport' });
    t.equal((await call('POST', `${P}/crashs/boxes/fromimport/exec`, { command: ['cat', '/root/f'] })).body?.stdout, 'one\n', `a box from it has the files: ${made.text.slice(0, 200)}`);
  });

  if (inPart('more')) t.test('base build', async (t) => {
    // Killed while the script runs: the retry runs it again in a fresh root from the parent.
    const script = 'echo once >> /etc/count; echo ran';
    const started = await dieAt(t, 'base-build:script', () => call('POST', '/v1/base-builds', { base: 'crashbuild', parent: 'busybox', script }));
    await restart();
    t.equal((await call('GET', `/v1/operations/${started.opId}/wait?timeout=120`)).body?.status, 'succeeded', 'the build converged');
    const build = (await call('GET', `/v1/base-builds/${started.box.id}`)).body;
    t.match(build, { status: 'succeeded', exit_code: 0 });
    t.equal((await call('GET', `/v1/base-builds/${started.box.id}/logs`)).text, 'ran\n', 'the log of the run that counted, once');
    t.same((await call('GET', `${P}/base-builds/boxes`)).body.boxes, [], 'no temporary box is left');
    const made = await call('POST', `${P}/crashb/boxes?wait=120`, { name: 'fb', base: 'crashbuild' });
    t.equal((await call('POST', `${P}/crashb/boxes/fb/exec`, { command: ['cat', '/etc/count'] })).body?.stdout, 'once\n', `the half-run script left nothing: ${made.text.slice(0, 100)}`);
  });

  if (inPart('more')) t.test('data backup and restore', async (t) => {
    t.equal((await call('POST', '/v1/data', { name: 'crashvol', size_gb: 1 })).status, 201);
    const made = await call('POST', `${P}/crashv/boxes?wait=120`, { name: 'v', data_mounts: [{ name: 'crashvol', path: '/data' }] });
    t.equal(made.body.status, 'running', made.text);
    const sh = async (script: string) => (await call('POST', `${P}/crashv/boxes/v/exec`, { command: ['sh', '-c', script] })).body?.stdout as string;
    const original = await sh('head -c 4194304 /dev/urandom > /data/blob && sync && sha256sum /data/blob');
    // Killed with the backup's snapshot taken, before its stream is written: the retry sends it.
    const backup = await dieAt(t, 'data-backup:held', () => call('POST', '/v1/data/crashvol/backups', { name: 'b1' }));
    await restart();
    t.equal((await call('GET', `/v1/operations/${backup.opId}/wait?timeout=120`)).body?.status, 'succeeded', 'the backup converged');
    const b1 = (await call('GET', '/v1/data/crashvol/backups/b1')).body;
    t.match(b1, { status: 'completed', mode: 'full' });
    const volId = fs.readdirSync(cfg.backupDir)[0];
    const stream = fs.readFileSync(path.join(cfg.backupDir, volId, 'b1.zfs'));
    t.equal(crypto.createHash('sha256').update(stream).digest('hex'), b1.sha256, 'the stream on disk is the one recorded');
    t.same(fs.readdirSync(path.join(cfg.backupDir, volId)).sort(), ['b1.json', 'b1.zfs'], 'no partial file is left');

    await sh('echo changed > /data/blob && sync');
    t.equal((await call('GET', `/v1/operations/${(await call('POST', `${P}/crashv/boxes/v/stop`)).headers.get('operation-id')}/wait?timeout=120`)).body?.status, 'succeeded');
    // Killed with the chain verified, before it is received: the retry receives it and swaps.
    const restore = await dieAt(t, 'data-restore:verified', () => call('POST', '/v1/data/crashvol/restore', { backup: 'b1' }));
    await restart();
    t.equal((await call('GET', `/v1/operations/${restore.opId}/wait?timeout=120`)).body?.status, 'succeeded', 'the restore converged');
    t.equal((await call('GET', `/v1/operations/${(await call('POST', `${P}/crashv/boxes/v/resume`)).headers.get('operation-id')}/wait?timeout=120`)).body?.status, 'succeeded');
    t.equal(await sh('sha256sum /data/blob'), original, 'the volume holds the backup, intact');
    const datasets = (await run(['zfs', 'list', '-H', '-o', 'name', '-t', 'all', '-r', `boxhost-${cfg.hostTag}`])).stdout;
    t.notMatch(datasets, /tmp\/(restore|old)-/, 'no temporary dataset of the restore is left');
  });

  if (inPart('steps')) t.test('delete', async (t) => {
    const points: [string, Partial<BoxObjects>][] = [
      ['destroy', RUNNING],
      ['destroy:container', { ...NOTHING, root: 1, netns: 1, leases: 1, guardElements: 3 }],
      ['destroy:network', { ...NOTHING, root: 1 }],
      ['destroy:done', NOTHING],
    ];
    for (const [i, [point, expected]] of points.entries()) {
      // Each in a project of its own: the project's bridge goes with its last box.
      const project = `crashd${i}`;
      const made = await call('POST', `${P}/${project}/boxes?wait=120`, { name: 'd' });
      t.equal(made.body?.status, 'running', made.text);
      const ports = await bridgePorts(project);
      // Once (CI, 2026-11-30) the box was gone by here, its bridge with it, for no cause the
      // log showed: what the db and the worker say then is in the message.
      t.equal(ports, 1, `${project} has its bridge${ports === 1 ? '' : `: ${await whatHappened(project, made.body?.id)}`}`);
      const { opId } = await dieAt(t, point, () => call('DELETE', `${P}/${project}/boxes/d`));
      t.equal((await opRow(opId)).status, 'running', `${point}: the operation was running`);
      t.equal((await boxRow(project, 'd')).status, 'deleting', `${point}: the box was deleting`);
      t.same(await boxObjects(cfg, made.body.id), expected, `${point}: the host held what the steps before it left`);
      if (point === 'destroy:network' || point === 'destroy:done') t.equal(await bridgePorts(project), null, `${point}: the bridge is gone`);
      await restart();
      const done = (await call('GET', `/v1/operations/${opId}/wait?timeout=120`)).body;
      t.equal(done?.status, 'succeeded', `${point}: the delete converged: ${JSON.stringify(done)}`);
      t.equal((await call('GET', `${P}/${project}/boxes/d`)).status, 404, 'the box is gone');
      t.same(await boxObjects(cfg, made.body.id), NOTHING, 'nothing of it is left on the host');
      t.equal(await bridgePorts(project), null, 'nor its project bridge');
    }
  });

  if (inPart('more')) t.test('an operation whose job Redis lost fails at the next worker start', async (t) => {
    // Instead of holding its box in `creating` forever; the half-made box is failed, and can be deleted.
    const { opId: lostOp, box } = await dieAt(t, 'createRoot:done', () => call('POST', `${P}/crash/boxes`, { name: 'lost' }));
    const queue = new Queue(nodeQueueName(cfg.nodeId), { connection: redisOptions(cfg) as ConnectionOptions, prefix: queuePrefix(cfg) });
    t.teardown(() => queue.close());
    // The dead worker's lock must lapse before the job can be removed.
    for (let i = 0; i < 100 && (await queue.getJob(lostOp)); i++) {
      await queue.remove(lostOp).catch(() => 0);
      await sleep(200);
    }
    t.notOk(await queue.getJob(lostOp), 'the job is gone from Redis');
    await restart();
    const lostDone = await call('GET', `/v1/operations/${lostOp}`);
    t.equal(lostDone.body.status, 'failed');
    t.match(lostDone.body.error, /lost/);
    const lostBox = (await call('GET', `${P}/crash/boxes/lost`)).body;
    t.equal(lostBox.status, 'failed');
    t.match(lostBox.error, /interrupted/);
    t.equal((await call('DELETE', `${P}/crash/boxes/lost?wait=60`)).status, 204, 'a failed box can be deleted');
    t.same(await boxObjects(cfg, box.id), NOTHING, 'nothing of it left');
  });

  if (inPart('steps')) t.test('a box marked running whose container vanished behind the host is started again', async (t) => {
    const c1 = (await call('GET', `${P}/crash/boxes/c1`)).body;
    await killWorker(worker);
    await run(['runc', '--root', `${cfg.dataDir}/runc`, 'delete', '--force', `bh${cfg.hostTag}-${c1.id}`]);
    t.equal((await boxObjects(cfg, c1.id)).containers, 0, 'control: the container is gone');
    worker = await startWorkerProcess(host);
    t.equal((await call('POST', `${P}/crash/boxes/c1/exec`, { command: ['echo', 'back'] })).body.stdout, 'back\n', 'reconciled: running again');
    t.same(await boxObjects(cfg, c1.id), RUNNING, 'with one of everything');
  });

  if (inPart('steps')) t.test('reconciliation removes a container, netns and dataset made behind the api', async (t) => {
    await killWorker(worker);
    // Made with the node's own steps, in this process, for boxes the db has never heard of: one
    // started (container, network, root), one only made (root, netns, user namespace).
    const drivers = createDrivers(cfg, pino({ level: 'silent' }));
    const steps = new BoxSteps({ db: host.db, ...drivers });
    const like = (await boxesRepo.get(host.db, 'crash', 'c0'))!;
    const [baseName, baseVersion] = like.base!.split('@');
    const full = { ...like, id: newBoxId(), name: 'ghost-full', address: null };
    const half = { ...like, id: newBoxId(), name: 'ghost-half', address: null };
    for (const b of [full, half]) await steps.createRoot(b, { kind: 'base', base: { name: baseName, version: baseVersion } });
    await steps.start(full);
    t.same(await boxObjects(cfg, full.id), RUNNING, 'control: an orphan that runs, with one of everything');
    t.same(await boxObjects(cfg, half.id), { ...NOTHING, root: 1, netns: 1, userns: 1 }, 'control: an orphan root and netns');
    t.notOk(await host.db('boxes').whereIn('id', [full.id, half.id]).first(), 'no row for either');
    const ports = await bridgePorts('crash');

    worker = await startWorkerProcess(host);
    t.same(await boxObjects(cfg, full.id), NOTHING, 'the running orphan is gone: container, network, root');
    t.same(await boxObjects(cfg, half.id), NOTHING, 'the half-made one too');
    t.equal(await bridgePorts('crash'), ports! - 1, "the orphan's port left the project bridge; the others stay");
    const report = worker.output
      .split('\n')
      .filter((l) => l.includes('reconciled host state'))
      .map((l) => JSON.parse(l))
      .pop();
    t.ok(report, 'reconciliation reported what it did');
    t.same(report?.orphanContainers, [full.id], 'the orphan container, named');
    t.same([...(report?.orphanRoots ?? [])].sort(), [full.id, half.id].sort(), 'the orphan roots, named');
    t.same([...(report?.orphanNetworks ?? [])].sort(), [full.id, half.id].sort(), 'the orphan netns, named');
    t.equal((await call('POST', `${P}/crash/boxes/c0/exec`, { command: ['true'] })).body.exit_code, 0, 'the real boxes are untouched');
  });

  if (inPart('steps')) t.test("a worker restart (killed or stopped) leaves running boxes' processes as they were", async (t) => {
    const c0 = (await call('GET', `${P}/crash/boxes/c0`)).body;
    const pid1 = async () => JSON.parse((await run(['runc', '--root', `${cfg.dataDir}/runc`, 'state', `bh${cfg.hostTag}-${c0.id}`])).stdout).pid as number;
    const bg = await call('POST', `${P}/crash/boxes/c0/exec`, { command: ['sleep', '100000'], no_hup: true });
    t.ok(bg.body.process > 0, 'a long-lived process in the box');
    const before = { pid1: await pid1(), bg: bg.body.process };
    for (const how of ['SIGKILL', 'SIGTERM'] as const) {
      const gone = workerExit(worker);
      worker.kill(how);
      t.match(await gone, how === 'SIGKILL' ? { signal: 'SIGKILL' } : { code: 0 }, `the worker ended (${how})`);
      worker = await startWorkerProcess(host);
      t.equal(await pid1(), before.pid1, `${how}: the container's PID 1 is the same process`);
      // `process` is the pid inside the box: looked at from there.
      const cmdline = await call('POST', `${P}/crash/boxes/c0/exec`, { command: ['cat', `/proc/${before.bg}/cmdline`] });
      t.equal(cmdline.body.exit_code, 0, `${how}: the exec'd process lives on`);
      t.equal(cmdline.body.stdout, 'sleep\x00100000\x00', `${how}: and is the same one`);
      t.equal((await call('GET', `${P}/crash/boxes/c0`)).body.status, 'running');
    }
    // Ended from inside the box: `process` is a pid of the box's namespace, not the host's (a
    // host kill of that number reached whatever host process had it, or none: ESRCH in CI).
    t.equal((await call('POST', `${P}/crash/boxes/c0/exec`, { command: ['kill', '-9', String(before.bg)] })).body?.exit_code, 0, 'the sleep is ended');
  });
});

/**
 * The whole host in one process (`npm start`: api + node + its embedded redis-server with an
 * append-only file) killed with SIGKILL together with its redis-server while operations are
 * queued and running: started again on the same data dir, every operation ends, as asked.
 */
if (inPart('more')) t.test('kill -9 of the whole host (api, node, embedded Redis) loses no operation', async (t) => {
  const pg = testDbKind() === 'postgres' ? await makePgSchema() : null;
  if (pg) t.teardown(() => pg.drop());
  const token = `admin-${crypto.randomBytes(16).toString('hex')}`;
  const dataDir = testDataDir();
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    BOXHOST_DATA_DIR: dataDir,
    BOXHOST_PORT: '0',
    BOXHOST_PROXY_PORT: '0',
    BOXHOST_HOST: '127.0.0.1',
    BOXHOST_BOX_SUBNET: testSubnet(),
    BOXHOST_POOL_SIZE_GB: '8',
    BOXHOST_STORAGE_OVERCOMMIT: '100',
    BOXHOST_ADMIN_TOKEN: token,
    LOG_LEVEL: 'info',
    ...(pg ? { DATABASE_URL: pg.url } : {}),
  };
  delete env.BOXHOST_TEST_CRASH_AT;
  const config = loadConfig(env, { readDotenv: false });
  t.teardown(() => cleanupHost(config));
  let proc = new RoleProcess('host', env).start();
  t.teardown(() => proc.kill('SIGTERM'));
  const url = async () => (await proc.waitFor(/"url":"(http:\/\/[^"]+)","msg":"api listening"/, 180_000))[1];
  let base = await url();
  const call = (method: string, p: string, body?: unknown) => request(base, method, p, token, { body });
  const P = '/v1/projects/whole/boxes';

  t.equal((await call('POST', `${P}?wait=120`, { name: 'a0' })).body?.status, 'running', 'a box to stop and resume');
  const ops: { what: string; id: string }[] = [];
  const queue = async (what: string, method: string, p: string, body?: unknown) => {
    const r = await call(method, p, body);
    t.equal(r.status, 202, `${what} accepted: ${r.text}`);
    ops.push({ what, id: r.headers.get('operation-id')! });
  };
  for (const n of ['k0', 'k1', 'k2', 'k3']) await queue(`create ${n}`, 'POST', P, { name: n });
  await queue('stop a0', 'POST', `${P}/a0/stop`);
  await queue('resume a0', 'POST', `${P}/a0/resume`);
  await queue('fork a0', 'POST', P, { name: 'a0-fork', fork: 'a0' });

  // The process and its redis-server child, both at once, with whatever is queued or running.
  const redisPid = Number((await run(['pgrep', '-P', String(proc.child.pid), 'redis-server'])).stdout.trim().split('\n')[0]);
  t.ok(redisPid > 0, `the embedded redis-server is the host's child (${redisPid})`);
  const states = await Promise.all(ops.map(async (o) => (await call('GET', `/v1/operations/${o.id}`)).body.status));
  t.comment(`at the kill: ${ops.map((o, i) => `${o.what} ${states[i]}`).join(', ')}`);
  // Otherwise the kill would prove nothing: some of the work must still be under way.
  t.ok(states.some((st) => st === 'queued' || st === 'running'), `the kill finds operations queued or running (${states.join(', ')})`);
  process.kill(redisPid, 'SIGKILL');
  await proc.kill('SIGKILL');
  for (let i = 0; i < 100 && fs.existsSync(`/proc/${redisPid}`); i++) await sleep(50);
  t.notOk(fs.existsSync(`/proc/${redisPid}`), 'redis-server is gone too');
  const aof = path.join(dataDir, 'redis');
  t.ok(fs.readdirSync(aof).some((f) => /appendonly/.test(f)), 'its append-only file is on disk');

  proc = new RoleProcess('host', env).start();
  base = await url();
  for (const o of ops) {
    const done = (await call('GET', `/v1/operations/${o.id}/wait?timeout=180`)).body;
    t.equal(done?.status, 'succeeded', `${o.what}: ended, succeeded (${JSON.stringify(done)})`);
  }
  const boxes = (await call('GET', P)).body.boxes.map((b: any) => [b.name, b.status]);
  t.same(boxes, [['a0', 'running'], ['a0-fork', 'running'], ['k0', 'running'], ['k1', 'running'], ['k2', 'running'], ['k3', 'running']], 'every box as its operations left it');
  for (const n of ['a0-fork', 'k3']) t.equal((await call('POST', `${P}/${n}/exec`, { command: ['hostname'] })).body?.stdout, `${n}\n`);
  for (const b of ['a0-fork', 'a0', 'k0', 'k1', 'k2', 'k3']) t.equal((await call('DELETE', `${P}/${b}?wait=120`)).status, 204, `${b} deleted`);
});
