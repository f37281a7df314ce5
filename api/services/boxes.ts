import type { ApiContext, Identity } from '../context';
import { boxesRepo, BoxConfig, BoxRecord, BoxStatus, DataMount } from '../../db/repos/boxes';
import { projectsRepo } from '../../db/repos/projects';
import { basesRepo } from '../../db/repos/bases';
import { operationsRepo } from '../../db/repos/operations';
import { newBoxId, now } from '../../core/ids';
import type { Db } from '../../db/knex';
import type { RootSource } from '../../workers/drivers';
import { conflict, forbidden, invalidField, notFound } from '../http/errors';
import { acceptedReply } from '../http/operation';
import type { Reply } from '../http/route';
import { assertProject } from './access';
import { isUniqueViolation } from '../../db/errors';
import { BOX_JOB, BoxJobPayload, projectedStatus } from '../../jobs/boxJobs';

export const BOX_DEFAULTS = { cpus: 1, ram_mb: 512, storage_gb: 10 };

export interface CreateBoxRequest {
  name: string;
  base?: string | null;
  config?: Partial<BoxConfig> | null;
  data_mounts?: DataMount[] | null;
  env_from?: { alias: string; box: string }[] | null;
  environment?: Record<string, string> | null;
  fork?: string | null;
  lifecycle?: string | null;
  pack?: string | null;
  tags?: Record<string, string> | null;
}

export interface UpdateBoxRequest {
  config?: { cpus?: number; ram_mb?: number };
  tags?: Record<string, string>;
  termination_grace_period_seconds?: number;
}

export const boxPath = (project: string, name: string) => `/v1/projects/${project}/boxes/${name}`;

/** The Box of the spec, plus `error`, `address` and `fork` (additions are allowed). */
export function toApiBox(b: BoxRecord) {
  return {
    id: b.id,
    name: b.name,
    project: b.project,
    status: b.status,
    error: b.error,
    created_at: b.created_at,
    updated_at: b.updated_at,
    base: b.base,
    fork: b.fork,
    config: b.config,
    data_mounts: b.data_mounts.map((m) => ({ ...m, ownership: { kind: 'persistent' } })),
    environment: b.environment,
    lifecycle: b.lifecycle,
    pack: b.pack,
    pack_rev: b.pack_rev,
    publishes: [],
    rollback_to: b.rollback_to,
    tags: b.tags,
    termination_grace_period_seconds: b.termination_grace_period_seconds,
    url_settings: b.url_settings,
    address: b.address,
  };
}
export type ApiBox = ReturnType<typeof toApiBox>;

export async function loadBox(db: Db, identity: Identity, project: string, name: string): Promise<BoxRecord> {
  assertProject(identity, project, `box ${project}/${name}`);
  const box = await boxesRepo.get(db, project, name);
  if (!box) throw notFound(`box ${project}/${name}`);
  return box;
}

const reload = (db: Db, id: string) => async () => {
  const b = await boxesRepo.byId(db, id);
  return b ? toApiBox(b) : null;
};

/** `name` is the newest version, `name@version` a pinned one. */
async function resolveBase(db: Db, spec: string) {
  const [name, version] = spec.split('@');
  const row = version ? await basesRepo.get(db, name, version) : await basesRepo.newest(db, name);
  if (!row) throw invalidField('base', `base ${spec} does not exist`);
  return row;
}

async function resolveFork(api: ApiContext, project: string, spec: string): Promise<{ source: RootSource; base: string | null }> {
  const [boxName, snapshot] = spec.split('@');
  const src = await boxesRepo.get(api.db, project, boxName);
  if (!src) throw invalidField('fork', `box ${project}/${boxName} does not exist`);
  if (src.status === 'creating' || src.status === 'deleting' || src.status === 'failed') {
    throw conflict(`box ${boxName} is ${src.status}; it can be forked once it is running or stopped`);
  }
  if (snapshot) {
    const snaps = await api.storage.listBoxSnapshots(src.id);
    if (!snaps.some((s) => s.name === snapshot)) throw invalidField('fork', `box ${boxName} has no snapshot ${snapshot}`);
  }
  return { source: { kind: 'box', boxId: src.id, snapshot }, base: src.base };
}

/** The create rules of the spec that need more than the schema. */
function checkCreateRules(api: ApiContext, req: CreateBoxRequest) {
  if (req.lifecycle !== undefined && req.lifecycle !== null) {
    if (req.lifecycle !== 'dev') throw invalidField('lifecycle', 'only dev is accepted; deploy instances are set internally');
    if (!req.pack) throw invalidField('lifecycle', 'lifecycle needs pack');
  }
  // Packs and data volumes come with their own issues; until then none is installed or exists.
  if (req.pack) throw invalidField('pack', `pack ${req.pack} is not installed`);
  for (const [i, e] of (req.env_from ?? []).entries()) throw invalidField(`env_from.${i}.box`, `box ${e.box} is not a pack instance`);
  for (const [i, m] of (req.data_mounts ?? []).entries()) throw invalidField(`data_mounts.${i}.name`, `data volume ${m.name} does not exist`);
  if (req.config?.region && req.config.region !== api.config.region) {
    throw invalidField('config.region', `this host serves region ${api.config.region}`);
  }
  if (req.fork && req.base) throw invalidField('fork', 'give base or fork, not both');
}

export async function createBox(api: ApiContext, identity: Identity, project: string, req: CreateBoxRequest, wait?: number): Promise<Reply> {
  if (identity.projects !== null && !identity.projects.includes(project)) throw forbidden(`this token cannot create boxes in project ${project}`);
  checkCreateRules(api, req);
  if (await boxesRepo.get(api.db, project, req.name)) throw conflict(`box ${project}/${req.name} already exists`);

  let source: RootSource;
  let base: string | null;
  if (req.fork) {
    ({ source, base } = await resolveFork(api, project, req.fork));
  } else {
    const row = await resolveBase(api.db, req.base ?? api.config.defaultBase);
    source = { kind: 'base', base: { name: row.name, version: row.version } };
    base = `${row.name}@${row.version}`;
  }

  const at = now();
  const box: BoxRecord = {
    id: newBoxId(),
    project,
    name: req.name,
    status: 'creating',
    error: null,
    base,
    fork: req.fork ?? null,
    config: { ...BOX_DEFAULTS, region: api.config.region, ...(req.config ?? {}) } as BoxConfig,
    environment: req.environment ?? {},
    tags: req.tags ?? {},
    data_mounts: [],
    lifecycle: null,
    pack: null,
    pack_rev: null,
    rollback_to: null,
    termination_grace_period_seconds: 10,
    url_settings: null,
    node: api.config.nodeId,
    address: null,
    created_at: at,
    updated_at: at,
  };
  const payload: BoxJobPayload = { boxId: box.id, source };
  let op;
  try {
    op = await api.db.transaction(async (trx) => {
      await projectsRepo.ensure(trx, project);
      await boxesRepo.insert(trx, box);
      return api.queue.enqueue(trx, { kind: BOX_JOB.create, payload, resource: boxPath(project, req.name), boxId: box.id, createdBy: identity.name });
    });
  } catch (e) {
    if (isUniqueViolation(e)) throw conflict(`box ${project}/${req.name} already exists`);
    throw e;
  }
  return acceptedReply(api, op, reload(api.db, box.id), wait);
}

/** Which request makes sense from which (projected) state: anything else is 409. */
const ALLOWED_FROM: Record<'stop' | 'resume' | 'delete', BoxStatus[]> = {
  stop: ['running'],
  resume: ['stopped'],
  delete: ['running', 'stopped', 'failed'],
};

const TRANSITIONAL: Record<'stop' | 'resume' | 'delete', BoxStatus> = { stop: 'stopping', resume: 'resuming', delete: 'deleting' };

/**
 * Stop, resume and delete: checked against the state the box will be in once the operations
 * queued before this one have run, then queued behind them. The box shows the transitional
 * state at once only when nothing is ahead of it; otherwise the job sets it when its turn comes.
 */
export async function changeBoxState(
  api: ApiContext,
  identity: Identity,
  project: string,
  name: string,
  action: 'stop' | 'resume' | 'delete',
  wait?: number,
): Promise<Reply> {
  const op = await api.db.transaction(async (trx) => {
    const box = await loadBox(trx, identity, project, name);
    const pending = await operationsRepo.unfinishedForBox(trx, box.id);
    const projected = projectedStatus(box.status, pending.map((p) => p.kind));
    if (!ALLOWED_FROM[action].includes(projected)) {
      throw conflict(`box ${project}/${name} is ${projected === box.status ? box.status : `going to be ${projected}`}; cannot ${action} it`);
    }
    if (pending.length === 0) await boxesRepo.update(trx, box.id, { status: TRANSITIONAL[action], error: null });
    const payload: BoxJobPayload = { boxId: box.id };
    return { op: await api.queue.enqueue(trx, { kind: BOX_JOB[action], payload, resource: boxPath(project, name), boxId: box.id, createdBy: identity.name }), id: box.id };
  });
  return acceptedReply(api, op.op, reload(api.db, op.id), wait);
}

export async function updateBox(api: ApiContext, identity: Identity, project: string, name: string, req: UpdateBoxRequest) {
  const box = await loadBox(api.db, identity, project, name);
  if (box.status === 'deleting') throw conflict(`box ${project}/${name} is being deleted`);
  const patch: Partial<BoxRecord> = {};
  if (req.config) patch.config = { ...box.config, ...req.config };
  if (req.tags) patch.tags = req.tags;
  if (req.termination_grace_period_seconds !== undefined) patch.termination_grace_period_seconds = req.termination_grace_period_seconds;
  // Limits change live on a running container; a stopped one gets them at its next start.
  if (req.config && box.status === 'running' && (await api.runtime.status(box.id)) === 'running') {
    await api.runtime.update(box.id, { cpus: req.config.cpus, ramMb: req.config.ram_mb });
  }
  await boxesRepo.update(api.db, box.id, patch);
  return toApiBox((await boxesRepo.byId(api.db, box.id))!);
}

export async function getBox(api: ApiContext, identity: Identity, project: string, name: string) {
  return toApiBox(await loadBox(api.db, identity, project, name));
}
