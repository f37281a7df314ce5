/**
 * The base build job run directly on BoxSteps and BaseSteps over the mock drivers and a real
 * sqlite file (docs/bases.md "Builds"): success saves the base where the temporary box ran and
 * removes the box; a failing script takes back only what the build reserved; a forced rebuild
 * keeps the old version when a box was made from it meanwhile; a retry after the script started
 * runs it again in a fresh root.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { UnrecoverableError } from 'bullmq';
import { createDb, migrate } from '../db/knex';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { basesRepo, NO_META } from '../db/repos/bases';
import { baseBuildsRepo, type BaseBuildRow } from '../db/repos/baseBuilds';
import { projectsRepo } from '../db/repos/projects';
import { createLogger } from '../core/logger';
import { newBoxId, newId, now } from '../core/ids';
import type { BaseRef } from '../core/box';
import type { JobContext, JobHandler } from '../jobs/types';
import type { BaseHost, BoxHost, VolumeHost } from '../jobs/ports';
import type { BaseBuildPayload } from '../jobs/baseJobs';
import { buildBaseJob } from '../jobs/baseBuild';
import { createBoxJob } from '../jobs/boxCreate';
import { BoxSteps } from '../workers/boxSteps';
import { BaseSteps } from '../workers/baseSteps';
import { createMockDrivers } from '../workers/mockDrivers';

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-build-'));
const db = createDb({ dataDir, databaseUrl: undefined });
const log = createLogger('silent');
const PARENT: BaseRef = { name: 'tiny', version: 'v1' };

t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

async function host() {
  const drivers = createMockDrivers();
  await drivers.storage.createBase(PARENT, async (dir) => fs.promises.writeFile(path.join(dir, 'hello'), 'hi'));
  const steps = new BoxSteps({ db, ...drivers });
  const bases = new BaseSteps({ storage: drivers.storage, runtime: drivers.runtime, stagingDir: dataDir, limits: { maxUnpackedBytes: 1e9 } });
  return { ...drivers, steps, bases };
}
type Host = Awaited<ReturnType<typeof host>>;

async function run<P>(handler: JobHandler<P>, payload: P, h: Host, attempts = 3): Promise<{ attempts: number; error?: Error }> {
  const operationId = newId('op');
  for (let attempt = 1; ; attempt++) {
    const ctx: JobContext<P> = {
      payload, operationId, attempt, lastAttempt: attempt >= attempts, db, log, node: h.steps as BoxHost, bases: h.bases as BaseHost,
      volumes: {} as VolumeHost, progress: async () => undefined,
    };
    try {
      await handler.run(ctx);
      return { attempts: attempt };
    } catch (e) {
      if (!ctx.lastAttempt && !(e instanceof UnrecoverableError)) continue;
      await handler.onFailed?.(ctx, e as Error);
      return { attempts: attempt, error: e as Error };
    }
  }
}

/** A build as the api records it: its temporary box made (running), the base reserved unless it exists. */
async function build(h: Host, base: string, opts: { force?: boolean; exists?: boolean } = {}) {
  const project = `p${newBoxId()}`;
  await projectsRepo.ensure(db, project, 256);
  const at = now();
  const version = 'abcdefabcdef';
  const box: BoxRecord = {
    id: newBoxId(), project, name: 'build-x', status: 'creating', error: null, base: 'tiny@v1', fork: null, config: { cpus: 1, ram_mb: 512, region: 'local', storage_gb: 3 },
    environment: {}, tags: {}, data_mounts: [], lifecycle: null, pack: null, pack_rev: null, rollback_to: null, termination_grace_period_seconds: 10, url_settings: null,
    node: 'local', address: null, created_at: at, updated_at: at,
  };
  await boxesRepo.insert(db, box);
  const made = await run(createBoxJob, { boxId: box.id, source: { kind: 'base', base: PARENT } }, h);
  if (made.error) throw made.error;
  if (!opts.exists) await basesRepo.reserve(db, { ...NO_META, name: base, version, origin: 'built', project: null, node: null, sha256: null, created_by: null });
  const row: BaseBuildRow = {
    id: newId('bb'), status: 'queued', base, version, parent: 'tiny@v1', script: 'make it', cached: false, force: Boolean(opts.force), project, owner: null, box_id: box.id, box: 'build-x',
    script_started: false, script_done: false, reserved: !opts.exists, replaced: false, exit_code: null, error: null, log_bytes: 0, created_by: null, created_at: at, updated_at: at,
  };
  await baseBuildsRepo.insert(db, row);
  const payload: BaseBuildPayload = { buildId: row.id, boxId: box.id, name: base, version };
  return { box, row, payload, ref: { name: base, version } };
}

t.test('success: the log kept, the base saved where the box ran, the temporary box gone', async (t) => {
  const h = await host();
  h.runtime.execHandler = () => ({ exitCode: 0, stdout: 'step one\n', stderr: 'warning\n' });
  const b = await build(h, 'ok-base');
  t.same(await run(buildBaseJob, b.payload, h), { attempts: 1 });
  t.match(await baseBuildsRepo.get(db, b.row.id), { status: 'succeeded', exit_code: 0, box: null });
  t.match(await basesRepo.get(db, 'ok-base', b.ref.version), { state: 'ready', node: 'local' });
  t.ok(await h.storage.hasBase(b.ref));
  t.equal(await boxesRepo.byId(db, b.box.id), undefined, 'the temporary box row is gone');
  t.notOk(await h.storage.hasBoxRoot(b.box.id), 'and its root');
  const log = (await baseBuildsRepo.logSince(db, b.row.id, 0)).map((r) => r.text).join('');
  t.match(log, /step one/);
  t.match(log, /warning/);
});

t.test('a failing script: failed with its exit code; the reserved version and the box go', async (t) => {
  const h = await host();
  h.runtime.execHandler = () => ({ exitCode: 3, stdout: 'no\n' });
  const b = await build(h, 'bad-base');
  const r = await run(buildBaseJob, b.payload, h);
  t.equal(r.attempts, 1, 'refused at once');
  t.match(await baseBuildsRepo.get(db, b.row.id), { status: 'failed', exit_code: 3, error: /exited 3/ });
  t.equal(await basesRepo.getAny(db, 'bad-base', b.ref.version), undefined);
  t.equal(await boxesRepo.byId(db, b.box.id), undefined);
});

t.test('force: a box made from the version meanwhile keeps it; with none, it is replaced', async (t) => {
  const h = await host();
  h.runtime.execHandler = () => ({ exitCode: 0, stdout: '' });
  // The old version, made by an earlier build.
  const first = await build(h, 'forced');
  await run(buildBaseJob, first.payload, h);
  const again = await build(h, 'forced', { force: true, exists: true });
  const user = await boxesRepo.byId(db, again.box.id);
  await boxesRepo.insert(db, { ...user!, id: newBoxId(), name: 'user', base: `forced@${again.ref.version}` });
  const r = await run(buildBaseJob, again.payload, h);
  t.match(r.error?.message, /in use by 1 box/);
  t.match(await basesRepo.getAny(db, 'forced', again.ref.version), { state: 'ready' }, 'the old version is kept');
  t.ok(await h.storage.hasBase(again.ref));
  await db('boxes').where({ name: 'user', base: `forced@${again.ref.version}` }).delete();
  const third = await build(h, 'forced', { force: true, exists: true });
  t.same(await run(buildBaseJob, third.payload, h), { attempts: 1 });
  t.match(await baseBuildsRepo.get(db, third.row.id), { status: 'succeeded', replaced: 1 });
  t.match(await basesRepo.getAny(db, 'forced', third.ref.version), { state: 'ready' });
});

t.test('a retry after the script started runs it in a fresh root, its log started over', async (t) => {
  const h = await host();
  let calls = 0;
  h.runtime.execHandler = () => {
    calls++;
    if (calls === 1) throw new Error('the agent went away');
    return { exitCode: 0, stdout: 'clean run\n' };
  };
  const b = await build(h, 'retried');
  const starts = h.runtime.starts.length;
  t.same(await run(buildBaseJob, b.payload, h), { attempts: 2 });
  t.ok(h.runtime.starts.length > starts, 'the box was started again from the parent');
  t.equal((await baseBuildsRepo.logSince(db, b.row.id, 0)).map((r) => r.text).join(''), 'clean run\n');
  t.match(await baseBuildsRepo.get(db, b.row.id), { status: 'succeeded' });
});

t.test('the package-source proxy: let in and opened only while the script runs, found in http_proxy', async (t) => {
  const drivers = createMockDrivers();
  await drivers.storage.createBase(PARENT, async (dir) => fs.promises.writeFile(path.join(dir, 'hello'), 'hi'));
  const allowed = new Map<string, string>();
  const sourcesProxy = {
    allow: async (id: string, address: string) => {
      allowed.set(id, address);
      return 3128;
    },
    disallow: (id: string) => void allowed.delete(id),
  };
  const steps = new BoxSteps({ db, ...drivers });
  const bases = new BaseSteps({ storage: drivers.storage, runtime: drivers.runtime, stagingDir: dataDir, limits: { maxUnpackedBytes: 1e9 }, sourcesProxy, network: drivers.network });
  const h = { ...drivers, steps, bases };
  const seen: { open: unknown; allowed: boolean; env: unknown }[] = [];
  h.runtime.execHandler = (boxId, call) => {
    seen.push({ open: h.network.sources.get(boxId), allowed: allowed.has(boxId), env: (call as { env?: unknown }).env });
    return { exitCode: 0, stdout: 'ok\n' };
  };
  const b = await build(h, 'sourced');
  t.equal(h.network.sources.size, 0, 'nothing is open before the script');
  t.same(await run(buildBaseJob, b.payload, h), { attempts: 1 });
  const box = seen[0];
  t.match(box.open, { port: 3128, address: /^\d+\.\d+\.\d+\.\d+$/ }, 'while the script ran, the box could reach the proxy port');
  t.ok(box.allowed, 'and the proxy let it in');
  const gateway = h.network.layout.block(h.network.layout.indexOf((box.open as { address: string }).address)!).gateway;
  t.match(box.env, { http_proxy: `http://${gateway}:3128/`, https_proxy: `http://${gateway}:3128/` }, 'apt finds it on the gateway');
  t.equal(h.network.sources.size, 0, 'nothing open once it ended');
  t.equal(allowed.size, 0, 'and the proxy let it go');
});
