import { allSettledOrThrow } from '../core/promises';
import type { DomainContext, Identity } from './context';
import { boxesRepo, BoxConfig, BoxRecord, DataMount } from '../db/repos/boxes';
import { resolveBase } from './baseResolve';
import { operationsRepo, type OperationRow } from '../db/repos/operations';
import { newBoxId, now } from '../core/ids';
import { allowed, BoxAction, BoxStatus, canFork, canUpdate, describeState, projectedStatus, RootSource, TRANSITIONS } from '../core/box';
import { BoxhostError, conflict, invalidField } from '../core/errors';
import type { Box, Publish } from '../core/apiTypes';
import { publishesRepo } from '../db/repos/publishes';
import { toPublish, urlSettings } from './publishView';
import { isUniqueViolation } from '../db/errors';
import { boxActionOf, boxJobs } from '../jobs/boxJobs';
import { packJobs } from '../jobs/packServices';
import { packsRepo } from '../db/repos/packs';
import { deploysRepo } from '../db/repos/deploys';
import { outputsRepo, type EnvLinkRow } from '../db/repos/outputs';
import { fromJson } from '../db/json';
import { putPublish, type PublishRequest } from './publishes';
import type { JobMessage } from '../jobs/types';
import type { Accepted } from './operations';
import { assertProject } from './access';
import { boxPath, loadBox } from './boxRef';
import { assertAddressRoom, assertQuota, ensureProject, nodesWithoutAddress } from './projects';
import { checkAttach, recordAttach, volumesOf } from './volumeAttach';
import { volumesRepo } from '../db/repos/volumes';

/** A box's config when the create names none (docs/decisions.md "Boxes"). */
export const BOX_DEFAULTS = { cpus: 1, ram_mb: 512, storage_gb: 2 };

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
  /** Not the route's: the `env_from` links domain/instances.ts resolved, kept with the box. */
  envLinks?: Omit<EnvLinkRow, 'box_id'>[];
}

export interface UpdateBoxRequest {
  config?: { cpus?: number; ram_mb?: number };
  tags?: Record<string, string>;
  termination_grace_period_seconds?: number;
}

/**
 * The Box of the spec, plus `error`, `address`, `fork` and `node` (additions are allowed). A box
 * whose node is down shows `unknown` with the node's reason: its last known status would be a
 * guess (docs/decisions.md "Nodes").
 */
export function toApiBox(b: BoxRecord, nodeDown?: string | null, publishes: Publish[] = [], url_settings: { auth: string } | null = b.url_settings): Box {
  return {
    id: b.id,
    name: b.name,
    project: b.project,
    status: nodeDown ? 'unknown' : b.status,
    error: nodeDown ? `${nodeDown}; last known status: ${b.status}` : b.error,
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
    publishes,
    rollback_to: b.rollback_to,
    tags: b.tags,
    termination_grace_period_seconds: b.termination_grace_period_seconds,
    url_settings,
    address: b.address,
    node: b.node,
  };
}

/** Boxes as the api shows them: one read of the nodes for the lot. */
export async function showBoxes(ctx: DomainContext, boxes: BoxRecord[]): Promise<Box[]> {
  const down = await ctx.nodes.downNodes(boxes.map((b) => b.node));
  const rows = boxes.length ? await publishesRepo.ofBoxes(ctx.db, boxes.map((b) => b.id)) : [];
  const settings = urlSettings(ctx.config);
  return boxes.map((b) => toApiBox(b, down.get(b.node), rows.filter((r) => r.box_id === b.id).map((r) => toPublish(ctx.config, r)), b.url_settings ?? settings));
}

export const showBox = async (ctx: DomainContext, box: BoxRecord): Promise<Box> => (await showBoxes(ctx, [box]))[0];

/** Reads a box again as the api shows it (null once gone): what an accepted operation answers. */
export const reload = (ctx: DomainContext, id: string) => async () => {
  const b = await boxesRepo.byId(ctx.db, id);
  return b ? showBox(ctx, b) : null;
};

/** A fork clones on its source's node (a ZFS clone is node-local), so it goes there. */
async function resolveFork(ctx: DomainContext, project: string, spec: string): Promise<{ source: RootSource; base: string | null; node: string; config: BoxConfig; environment: Record<string, string> }> {
  const [boxName, snapshot] = spec.split('@');
  const src = await boxesRepo.get(ctx.db, project, boxName);
  if (!src) throw invalidField('fork', `box ${project}/${boxName} does not exist`);
  const node = await ctx.nodes.client(src.node);
  // A source still creating may have no root yet (a fork's job is not queued behind its
  // source's create); otherwise it is judged on the state it will be in (a source with a delete
  // queued is not forked; one stopping or resuming keeps its root and can be).
  const projected = projectedStatus(src.status, await pendingActions(ctx.db, src.id));
  if (src.status === 'creating') throw conflict(`box ${project}/${boxName} is creating; it can be forked once it is running or stopped`);
  if (!canFork(projected)) throw conflict(`box ${project}/${boxName} is ${describeState(src.status, projected)}; it can be forked once it is running or stopped`);
  if (snapshot) {
    const snaps = await node.listSnapshots(src.id);
    if (!snaps.some((s) => s.name === snapshot)) throw invalidField('fork', `box ${boxName} has no snapshot ${snapshot}`);
  }
  // Its own environment, not what its env_from links rendered (secrets among them): those are
  // the source's links', refreshed at each of its starts, and would freeze in a copy.
  const linked = new Set((await outputsRepo.links(ctx.db, src.id)).flatMap((l) => fromJson<string[]>(l.keys) ?? []));
  const environment = Object.fromEntries(Object.entries(src.environment ?? {}).filter(([k]) => !linked.has(k)));
  return { source: { kind: 'box', boxId: src.id, snapshot }, base: src.base, node: src.node, config: src.config, environment };
}

/** What a node refuses a new box with when it cannot take it now (down, full, no address). */
const NO_ROOM_CODES: ReadonlySet<string> = new Set(['unavailable', 'insufficient_storage', 'conflict']);
const needOf = (c: BoxConfig) => ({ cpus: c.cpus, ram_mb: c.ram_mb, storage_gb: c.storage_gb });

/** Runs a node's room check for a new box of `config` (`check` gets its need: the config and one
 *  box). A project at its quota hears that first, not that no node can take the box now (503,
 *  507, 409): the quota is what it can act on, and it holds whatever the nodes say. The quota is
 *  read only on such a refusal (the create's transaction checks it again, locked). */
async function nodeRoom<T>(ctx: DomainContext, project: string, config: BoxConfig, check: (need: ReturnType<typeof needOf> & { boxes: 1 }) => Promise<T>): Promise<T> {
  const need = { ...needOf(config), boxes: 1 as const };
  try {
    return await check(need);
  } catch (e) {
    if (e instanceof BoxhostError && NO_ROOM_CODES.has(e.code)) await assertQuota(ctx, ctx.db, project, need);
    throw e;
  }
}

/** Where a new box goes and what it is made from: a fork on its source's node with its
 *  source's config; a box of a saved or imported base where the base is; one with data volumes
 *  where they are; any other on the node placement picks. */
async function placeBox(
  ctx: DomainContext, identity: Identity, project: string, req: CreateBoxRequest, volumes: Awaited<ReturnType<typeof volumesOf>>, instance?: InstanceOf,
): Promise<{ source: RootSource; base: string | null; node: string; config: BoxConfig; environment?: Record<string, string> }> {
  if (req.fork) {
    // A fork holds its source's files: it takes its source's config unless the request says
    // otherwise, and stays in its region (on its node).
    const fork = await resolveFork(ctx, project, req.fork);
    if (req.config?.region && req.config.region !== fork.config.region) throw invalidField('config.region', `a fork stays in its source's region ${fork.config.region}`);
    const config = { ...fork.config, ...(req.config ?? {}) };
    await nodeRoom(ctx, project, config, (need) => ctx.nodes.assertRoom(fork.node, need));
    return { source: fork.source, base: fork.base, node: fork.node, config, environment: fork.environment };
  }
  const config: BoxConfig = { ...BOX_DEFAULTS, region: ctx.config.region, ...(req.config ?? {}) };
  const spec = req.base ?? ctx.config.defaultBase;
  const pending = instance?.pendingBase;
  const row = pending ? { name: pending.name, version: pending.version, node: pending.node } : await resolveBase(ctx, identity, spec, project);
  if (!row) throw invalidField('base', `base ${spec} does not exist`);
  const source: RootSource = { kind: 'base', base: { name: row.name, version: row.version } };
  const base = `${row.name}@${row.version}`;
  const volumeNode = volumes[0]?.vol.node;
  if (row.node && volumeNode && row.node !== volumeNode) throw conflict(`base ${base} is on node ${row.node} and data volume ${volumes[0].vol.name} on node ${volumeNode}; a box is made where both are`);
  if (!row.node && !volumeNode) {
    // Nodes where the project's block is full are passed over (docs/decisions.md "Network").
    const node = await nodeRoom(ctx, project, config, async (need) => ctx.nodes.place(config.region, need, await nodesWithoutAddress(ctx, project)));
    return { source, base, node, config };
  }
  // A saved or imported base is on the node that made it (docs/bases.md "Nodes"); a box with
  // data volumes goes where they are (docs/data.md).
  const node = row.node ?? volumeNode!;
  const region = req.config?.region ? (await ctx.nodes.get(node)).region : undefined;
  if (region !== undefined && req.config!.region !== region) throw invalidField('config.region', `base ${base} is on node ${node}, in region ${region}`);
  await nodeRoom(ctx, project, config, async (need) => {
    await ctx.nodes.assertUp(node);
    await ctx.nodes.assertRoom(node, need);
    const full = (await nodesWithoutAddress(ctx, project)).get(node);
    if (full) throw conflict(full);
  });
  return { source, base, node, config };
}

/** The create rules of the spec that need more than the schema (pack, lifecycle and env_from
 *  are domain/instances.ts's, which resolves them before it calls createBox). */
function checkCreateRules(req: CreateBoxRequest) {
  if (req.fork && req.base) throw invalidField('fork', 'give base or fork, not both');
}

/** What makes a box a pack instance (domain/instances.ts): recorded on its row. */
export interface InstanceOf {
  pack: string;
  pack_rev: string;
  lifecycle: 'dev' | 'deploy' | null;
  /** Its base is being built on `node`: the box goes there, and its create job waits for it. */
  pendingBase?: { name: string; version: string; node: string };
  /** Its revision has services: a job that starts them is queued behind the create, and that is
   *  the operation the create answers with (so `?wait` waits for their ready gates too). */
  services?: boolean;
  /** Their publishes, written with the box (the proxy answers 502 until a service listens). */
  publishes?: PublishRequest[];
  /** A deploy generation: the generation it replaces (the box's `rollback_to`). */
  rollbackTo?: string;
  /** A deploy generation: what is queued behind its create, in the create's transaction, in
   *  place of the services job; its operation is the one the create answers with. */
  followUp?: (trx: DomainContext['db'], box: BoxRecord) => Promise<OperationRow>;
}

/** The state-machine actions queued or running on a box, in arrival order. */
export const pendingActions = async (db: DomainContext['db'], boxId: string): Promise<BoxAction[]> =>
  (await operationsRepo.unfinishedForBox(db, boxId)).map((p) => boxActionOf(p.kind)).filter((a): a is BoxAction => a !== undefined);

/** Queues a box job on the box's node, recording the operation with its project. */
export const enqueueBoxJob = <P>(ctx: DomainContext, trx: DomainContext['db'], box: BoxRecord, msg: JobMessage<P>, identity: Identity) =>
  ctx.queue.enqueue(trx, msg, { resource: boxPath(box.project, box.name), node: box.node, project: box.project, boxId: box.id, createdBy: identity.name });

export async function createBox(ctx: DomainContext, identity: Identity, project: string, req: CreateBoxRequest, instance?: InstanceOf): Promise<Accepted<Box>> {
  assertProject(identity, project, `project ${project}`);
  checkCreateRules(req);
  // Both looked up at once; the box's answer first.
  const [existing, line] = await allSettledOrThrow([boxesRepo.get(ctx.db, project, req.name), deploysRepo.line(ctx.db, project, req.name)] as const);
  if (existing) {
    // A delete under way frees the name when it is done: say so, and what to wait on.
    if (existing.status === 'deleting') throw conflict(`box ${project}/${req.name} is being deleted; its name is free once that is done (GET /v1/operations?project=${project}&box=${req.name}&status=queued,running names the operation to wait on)`);
    throw conflict(`box ${project}/${req.name} already exists`);
  }
  // A deploy line keeps its name (and its publishes' hosts) after the box first named so is gone.
  if (line) throw conflict(`${req.name} is the name of a deploy line of project ${project} (live box ${(await boxesRepo.byId(ctx.db, line.live_box_id))?.name ?? line.live_box_id}); pick another name`);

  const volumes = await volumesOf(ctx, identity, req.data_mounts ?? []);
  const { source, base, node, config, environment } = await placeBox(ctx, identity, project, req, volumes, instance);

  const at = now();
  const box: BoxRecord = {
    id: newBoxId(),
    project,
    name: req.name,
    status: TRANSITIONS.create.during,
    error: null,
    base,
    fork: req.fork ?? null,
    config,
    // A fork takes its source's own environment (as its config), the request's entries over it.
    environment: { ...(environment ?? {}), ...(req.environment ?? {}) },
    tags: req.tags ?? {},
    data_mounts: [],
    lifecycle: instance?.lifecycle ?? null,
    pack: instance?.pack ?? null,
    pack_rev: instance?.pack_rev ?? null,
    rollback_to: instance?.rollbackTo ?? null,
    termination_grace_period_seconds: 10,
    url_settings: null,
    node,
    address: null,
    created_at: at,
    updated_at: at,
  };
  try {
    const operation = await ctx.db.transaction(async (trx) => {
      // Read (or made) once, locked: the quota and address checks below count under its lock.
      const projectRow = await ensureProject(ctx, trx, project, { lock: true });
      // Volumes with no project yet join this one: their quota counts with the box's.
      const joining = volumes.filter((v) => v.vol.project === null);
      const need = needOf(config);
      await assertQuota(ctx, trx, projectRow, { boxes: 1, ...need, storage_gb: need.storage_gb + joining.reduce((n, v) => n + v.vol.quota_gb, 0), volumes: joining.length });
      // After the quota check has locked the project row: creates at the edge count in turn.
      await assertAddressRoom(ctx, trx, projectRow, node);
      await ctx.nodes.assertRootRoom(trx, node, need);
      for (const [i, v] of volumes.entries()) {
        const vol = await volumesRepo.lock(trx, v.vol.id);
        if (!vol) throw invalidField(`data_mounts.${i}.name`, `data volume ${v.mount.name} does not exist`);
        checkAttach(vol, box, v.mount.path, `data_mounts.${i}.path`);
        box.data_mounts = await recordAttach(ctx, trx, vol, box, v.mount, { quotaChecked: true });
      }
      // An instance's pack, locked: a delete of it waits for this insert and then sees the instance.
      if (instance && !(await packsRepo.lock(trx, instance.pack))) throw invalidField('pack', `pack ${instance.pack} is not installed`);
      await boxesRepo.insert(trx, box);
      await outputsRepo.insertLinks(trx, (req.envLinks ?? []).map((l) => ({ ...l, box_id: box.id })));
      const created = await enqueueBoxJob(ctx, trx, box, boxJobs.create.of({ boxId: box.id, source }), identity);
      for (const p of instance?.publishes ?? []) await putPublish({ db: trx, config: ctx.config }, box, p);
      if (instance?.followUp) return instance.followUp(trx, box);
      return instance?.services ? enqueueBoxJob(ctx, trx, box, packJobs.services.of({ boxId: box.id }), identity) : created;
    });
    return { operation, load: reload(ctx, box.id) };
  } catch (e) {
    if (isUniqueViolation(e)) throw conflict(`box ${project}/${req.name} already exists`);
    throw e;
  }
}

/**
 * Stop, resume and delete: checked against the state the box will be in once the operations
 * queued before this one have run, then queued behind them on the box's node. The box shows
 * the transitional state at once only when nothing is ahead of it; otherwise the job sets it
 * when its turn comes. A box whose node is down answers 503: the job would only wait.
 */
export async function changeBoxState(ctx: DomainContext, identity: Identity, project: string, name: string, action: Exclude<BoxAction, 'create' | 'restore'>): Promise<Accepted<Box>> {
  return queueBoxAction(ctx, identity, project, name, action, (box, from) =>
    action === 'resume' && from === 'failed' ? boxJobs.resume.of({ boxId: box.id, from }) : boxJobs[action].of({ boxId: box.id }));
}

/** The same for any action of the state machine, with the job message its payload needs. */
export async function queueBoxAction<P>(ctx: DomainContext, identity: Identity, project: string, name: string, action: Exclude<BoxAction, 'create'>, message: (box: BoxRecord, from: BoxStatus) => JobMessage<P>): Promise<Accepted<Box>> {
  const current = await loadBox(ctx, identity, project, name);
  if (action === 'delete' && (await ctx.nodes.forgotten(current.node))) return forgetLostBox(ctx, identity, current);
  await ctx.nodes.assertUp(current.node);
  const operation = await ctx.db.transaction(async (trx) => {
    // Locked (Postgres), so that two api processes cannot both take an action on one box.
    const box = await loadBox({ db: trx }, identity, project, name, { lock: true });
    const pending = await pendingActions(trx, box.id);
    if (!allowed(action, box.status, pending)) {
      const projected = projectedStatus(box.status, pending);
      throw conflict(`box ${project}/${name} is ${describeState(box.status, projected)}; cannot ${action} it`);
    }
    // A create that failed for good removed what it made (jobs/boxCreate.ts): nothing to start.
    if (action === 'resume' && projectedStatus(box.status, pending) === 'failed' && /^create failed/.test(box.error ?? '')) {
      throw conflict(`box ${project}/${name} failed while it was being created (${box.error}); it has nothing to start: delete it and create it again`);
    }
    // Shown at once only when nothing at all is ahead of it: a snapshot queued before it runs
    // on the status the box has until this job's turn.
    // A failed box keeps its error until the action succeeds: a refused resume leaves it failed
    // with the reason it had.
    if ((await operationsRepo.unfinishedForBox(trx, box.id)).length === 0) await boxesRepo.update(trx, box.id, { status: TRANSITIONS[action].during, ...(box.status === 'failed' ? {} : { error: null }) });
    return enqueueBoxJob(ctx, trx, box, message(box, projectedStatus(box.status, pending)), identity);
  });
  return { operation, load: reload(ctx, current.id) };
}

/** A box whose node was removed for good has nothing left on any host: its delete is the row
 *  alone, done at once (the operation is recorded as succeeded). */
async function forgetLostBox(ctx: DomainContext, identity: Identity, box: BoxRecord): Promise<Accepted<Box>> {
  const operation = await ctx.db.transaction(async (trx) => {
    await boxesRepo.remove(trx, box.id);
    return ctx.queue.recordDone(trx, boxJobs.delete.of({ boxId: box.id }), {
      resource: boxPath(box.project, box.name), node: box.node, project: box.project, boxId: box.id, createdBy: identity.name,
    });
  });
  return { operation, load: async () => null };
}

export async function updateBox(ctx: DomainContext, identity: Identity, project: string, name: string, req: UpdateBoxRequest): Promise<Box> {
  const box = await loadBox(ctx, identity, project, name);
  if (!canUpdate(box.status)) throw conflict(`box ${project}/${name} is being deleted`);
  const patch: Partial<BoxRecord> = {};
  if (req.config) {
    patch.config = { ...box.config, ...req.config };
    // Growing limits must fit the node and the project.
    const more = { cpus: Math.max(0, patch.config.cpus - box.config.cpus), ram_mb: Math.max(0, patch.config.ram_mb - box.config.ram_mb), storage_gb: 0 };
    if (more.cpus > 0 || more.ram_mb > 0) {
      await ctx.nodes.assertRoom(box.node, more);
      await assertQuota(ctx, ctx.db, box.project, { boxes: 0, ...more });
    }
  }
  if (req.tags) patch.tags = req.tags;
  if (req.termination_grace_period_seconds !== undefined) patch.termination_grace_period_seconds = req.termination_grace_period_seconds;
  // Limits change live on a running container (through its node); a stopped one gets them at
  // its next start, from the row.
  if (req.config && box.status === 'running') {
    const node = await ctx.nodes.client(box.node);
    await node.updateLimits(box.id, { cpus: req.config.cpus, ramMb: req.config.ram_mb });
  }
  await boxesRepo.update(ctx.db, box.id, patch);
  return showBox(ctx, (await boxesRepo.byId(ctx.db, box.id))!);
}

export async function getBox(ctx: DomainContext, identity: Identity, project: string, name: string): Promise<Box> {
  return showBox(ctx, await loadBox(ctx, identity, project, name));
}
