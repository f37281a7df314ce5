/**
 * The deploy generation jobs (jobs/packDeploy.ts) run directly on a real sqlite file with a box
 * host that records what it is asked: the switch (the revision's publishes under the line's
 * hosts, hand-made publishes moving with the line, rollback_to, the line's live box), a retry after
 * the switch committed, a deploy the line no longer expects, a gate that fails (the line stays and
 * can be deployed again); retire: waiting for the deploy, then the drain, then stop or delete, and
 * nothing when the deploy ended the other way.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { createDb, migrate } from '../db/knex';
import { createLogger } from '../core/logger';
import { newId, now } from '../core/ids';
import { BoxhostError } from '../core/errors';
import type { JobContext } from '../jobs/types';
import { JobNotYet, JobRefused } from '../jobs/types';
import type { BaseHost, BoxHost, VolumeHost } from '../jobs/ports';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { deploysRepo } from '../db/repos/deploys';
import { publishesRepo } from '../db/repos/publishes';
import { operationsRepo } from '../db/repos/operations';
import { packDeployJob, packRetireJob, type DeployPayload, type RetirePayload } from '../jobs/packDeploy';

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-deploy-'));
const db = createDb({ dataDir, databaseUrl: undefined });
const log = createLogger('silent');
const refuse = <T extends object>(what: string) => new Proxy({} as T, { get: (_t, p) => () => Promise.reject(new Error(`a deploy job called ${what} step ${String(p)}`)) });

t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

/** A box host that records its calls; `failService` makes startService refuse. */
function recordingHost(opts: { failService?: boolean } = {}) {
  const calls: string[] = [];
  const host = {
    startService: async (box: BoxRecord, spec: { name: string }) => {
      calls.push(`start ${box.name}/${spec.name}`);
      if (opts.failService) throw new BoxhostError('conflict', `service ${spec.name} is not ready: port 8080 did not open`);
    },
    stop: async (box: BoxRecord) => void calls.push(`stop ${box.name}`),
    destroy: async (box: Pick<BoxRecord, 'id'>) => void calls.push(`destroy ${box.id}`),
  } as unknown as BoxHost;
  return { host, calls };
}

const ctxOf = <P>(node: BoxHost, payload: P, operationId: string): JobContext<P> =>
  ({ payload, operationId, attempt: 1, lastAttempt: true, db, log, node, bases: refuse<BaseHost>('base'), volumes: refuse<VolumeHost>('volume'), progress: async () => undefined });

const REV_CONTENT = JSON.stringify({ base: 'b', parent: 'busybox', script: 'true', services: [{ name: 'web', command: ['httpd'], port: 8080, publish: { name: 'web' } }] });

async function box(name: string, status: BoxRecord['status'] = 'running'): Promise<BoxRecord> {
  const at = now();
  const b: BoxRecord = {
    id: newId('b').replace(/[^a-z0-9]/g, '').slice(0, 16), project: 'p', name, status, error: null, base: 'b@1', fork: null,
    config: { cpus: 1, ram_mb: 256, storage_gb: 1, region: 'local' }, environment: {}, tags: {}, data_mounts: [],
    lifecycle: null, pack: 'site', pack_rev: 'r1', rollback_to: null, termination_grace_period_seconds: 1, url_settings: null,
    node: 'local', address: '10.0.0.2', created_at: at, updated_at: at,
  };
  await boxesRepo.insert(db, b);
  return b;
}

async function operation(boxId: string, status: 'queued' | 'running' | 'succeeded' | 'failed' = 'running', kind = 'pack.deploy'): Promise<string> {
  const id = newId('op');
  const at = now();
  await operationsRepo.insert(db, { id, kind, status, resource: '/x', box_id: boxId, project: 'p', node: 'local', progress: null, error: null, payload: '{}', created_by: 'admin', created_at: at, updated_at: at });
  return id;
}

const publishRow = (host: string, boxId: string, name: string, service: string | null) => {
  const at = now();
  return { host, box_id: boxId, project: 'p', name, port: 8080, public: true, service, warning: null, created_at: at, updated_at: at };
};

/** A line `line` whose live box is `live`, with a deploy to `next` under way as operation `op`. */
async function line(name: string, live: BoxRecord, next: BoxRecord, op: string | null) {
  const at = now();
  await deploysRepo.insertLine(db, { project: 'p', line: name, live_box_id: live.id, generation: 2, deploy_op: op, switched_at: null, switched_by: null, created_at: at, updated_at: at });
  await deploysRepo.insertGeneration(db, { box_id: live.id, project: 'p', line: name, generation: 1 });
  await deploysRepo.insertGeneration(db, { box_id: next.id, project: 'p', line: name, generation: 2 });
}

t.before(async () => {
  await db('pack_revisions').insert({ pack: 'site', rev: 'r1', content: REV_CONTENT, created_at: now() });
});

t.test('deploy: services first, then the switch in one go; a retry after it changes nothing', async (t) => {
  const live = await box('web');
  const next = await box('web-g2');
  const op = await operation(next.id);
  await line('web', live, next, op);
  await publishesRepo.insert(db, publishRow('web--web--p.localhost', live.id, 'web', 'web'));
  await publishesRepo.insert(db, publishRow('extra--web--p.localhost', live.id, 'extra', null));
  const payload: DeployPayload = { boxId: next.id, project: 'p', line: 'web', rollback: false, publishes: [{ host: 'web--web--p.localhost', name: 'web', port: 8080, public: true, service: 'web', warning: null }] };
  const { host, calls } = recordingHost();
  await packDeployJob.run(ctxOf(host, payload, op));
  t.same(calls, ['start web-g2/web'], "the revision's service started in the new generation");
  const moved = (await publishesRepo.ofBox(db, next.id)).map((p) => [p.name, p.host]);
  t.same(moved, [['extra', 'extra--web--p.localhost'], ['web', 'web--web--p.localhost']], "the line's hosts, a hand-made publish too");
  t.same(await publishesRepo.ofBox(db, live.id), [], 'the old generation serves none');
  t.match(await deploysRepo.line(db, 'p', 'web'), { live_box_id: next.id, deploy_op: null, switched_by: op });
  t.equal((await boxesRepo.byId(db, next.id))!.rollback_to, 'web');
  t.match(await db('events').where({ box_id: next.id, kind: 'box.deployed' }), [{ box_name: 'web-g2' }], 'the switch recorded its event');
  await packDeployJob.run(ctxOf(host, payload, op));
  t.same(calls, ['start web-g2/web'], 'a retry after the switch does nothing');
});

t.test('deploy: refused when the line expects another operation; a failing gate leaves the line', async (t) => {
  const live = await box('api');
  const next = await box('api-g2');
  const op = await operation(next.id);
  await line('api', live, next, 'op_someoneelse');
  const payload: DeployPayload = { boxId: next.id, project: 'p', line: 'api', rollback: false, publishes: [] };
  const { host, calls } = recordingHost();
  await t.rejects(packDeployJob.run(ctxOf(host, payload, op)), JobRefused);
  t.same(calls, [], 'nothing started');
  await packDeployJob.onFailed!(ctxOf(host, payload, op), new Error('x'));
  t.equal((await deploysRepo.line(db, 'p', 'api'))!.deploy_op, 'op_someoneelse', "another deploy's mark is not cleared");

  await deploysRepo.updateLine(db, 'p', 'api', { deploy_op: op });
  const failing = recordingHost({ failService: true });
  const err = await packDeployJob.run(ctxOf(failing.host, payload, op)).catch((e) => e);
  t.type(err, JobRefused);
  t.match(err.message, /service web: .*did not open/);
  await packDeployJob.onFailed!(ctxOf(failing.host, payload, op), err);
  t.match(await deploysRepo.line(db, 'p', 'api'), { live_box_id: live.id, deploy_op: null }, 'the line stays, free for the next deploy');
});

t.test('retire: waits for the deploy and the drain, then stops or deletes; nothing when it ended the other way', async (t) => {
  const old = await box('svc');
  const older = await box('svc-old', 'stopped');
  const next = await box('svc-g2');
  const op = await operation(next.id, 'running');
  await line('svc', old, next, op);
  await deploysRepo.insertGeneration(db, { box_id: older.id, project: 'p', line: 'svc', generation: 0 });
  const stop: RetirePayload = { boxId: old.id, deployOp: op, when: 'switched', action: 'stop', drainMs: 60_000 };
  const { host, calls } = recordingHost();
  await t.rejects(packRetireJob.run(ctxOf(host, stop, newId('op'))), JobNotYet, 'the deploy is under way: wait');

  // The deploy switched the line, and its operation then failed anyway (its run lost after the
  // commit): the line, not the operation, says what happened.
  await operationsRepo.update(db, op, { status: 'failed' });
  await deploysRepo.updateLine(db, 'p', 'svc', { live_box_id: next.id, deploy_op: null, switched_at: now(), switched_by: op });
  const draining = await packRetireJob.run(ctxOf(host, stop, newId('op'))).catch((e) => e);
  t.type(draining, JobNotYet, 'switched a moment ago: still draining');
  t.ok(draining.retryInMs > 50_000 && draining.retryInMs <= 60_050, `looks again when the drain ends (${draining.retryInMs} ms)`);
  t.same(calls, []);

  await packRetireJob.run(ctxOf(host, { boxId: old.id, deployOp: op, when: 'failed', action: 'stop', drainMs: 0 }, newId('op')));
  t.same(calls, [], "a 'failed' retire does nothing to a box the deploy switched away from");
  await packRetireJob.run(ctxOf(host, { ...stop, drainMs: 0 }, newId('op')));
  t.same(calls, ['stop svc'], 'drained: stopped');
  t.equal((await boxesRepo.byId(db, old.id))!.status, 'stopped', 'and kept');

  await packRetireJob.run(ctxOf(host, { boxId: older.id, deployOp: op, when: 'switched', action: 'delete', drainMs: 0 }, newId('op')));
  t.same(calls, ['stop svc', `destroy ${older.id}`], 'an older generation is deleted');
  t.equal(await boxesRepo.byId(db, older.id), undefined);
  t.equal(await deploysRepo.generationOf(db, older.id), undefined, 'with its generation row');

  // A deploy that failed (the line never switched by it): the generation it tried is stopped,
  // the others are left alone.
  const tried = await box('svc-g3');
  const spare = await box('svc-spare');
  const failedOp = await operation(tried.id, 'failed');
  await deploysRepo.insertGeneration(db, { box_id: tried.id, project: 'p', line: 'svc', generation: 3 });
  await deploysRepo.insertGeneration(db, { box_id: spare.id, project: 'p', line: 'svc', generation: 4 });
  await packRetireJob.run(ctxOf(host, { boxId: spare.id, deployOp: failedOp, when: 'switched', action: 'stop', drainMs: 0 }, newId('op')));
  t.same(calls.length, 2, "a 'switched' retire does nothing when the deploy failed");
  await packRetireJob.run(ctxOf(host, { boxId: tried.id, deployOp: failedOp, when: 'failed', action: 'stop', drainMs: 0 }, newId('op')));
  t.same(calls.slice(2), ['stop svc-g3'], 'the failed generation is stopped');

  // A rollback to a box under way (asked during the drain): its retire leaves it running.
  const back = await operation(spare.id, 'queued');
  await deploysRepo.updateLine(db, 'p', 'svc', { deploy_op: back });
  const switchedOp = await operation(next.id, 'succeeded');
  await deploysRepo.updateLine(db, 'p', 'svc', { live_box_id: next.id, switched_by: switchedOp, switched_at: new Date(0).toISOString() });
  await packRetireJob.run(ctxOf(host, { boxId: spare.id, deployOp: switchedOp, when: 'switched', action: 'stop', drainMs: 0 }, newId('op')));
  t.same(calls.slice(2), ['stop svc-g3'], 'the box a rollback is bringing back is not stopped');

  // Deleting the live box ends its line.
  await boxesRepo.remove(db, next.id);
  t.equal(await deploysRepo.line(db, 'p', 'svc'), undefined);
  t.same(await deploysRepo.generations(db, 'p', 'svc'), []);
});
