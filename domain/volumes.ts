import type { DomainContext, Identity } from './context';
import type { AttachDataRequest, Box, CreateDataVolumeRequest, DataVolume, DetachDataRequest } from '../core/apiTypes';
import { volumesRepo, toAttachment, type AttachmentRow, type VolumeRow } from '../db/repos/volumes';
import { boxesRepo } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { assertProject } from './access';
import { BoxhostError, conflict, forbidden, notFound } from '../core/errors';
import { checkAttach, findVolume, notReady, recordAttach } from './volumeAttach';
import { now, randomId } from '../core/ids';
import { projectedStatus, VOLUME_HOLDING_STATUSES } from '../core/box';
import { dataJobs, volumeTurnKey } from '../jobs/dataJobs';
import type { JobMessage } from '../jobs/types';
import type { OperationRow } from '../db/repos/operations';
import { assertQuota, ensureProject } from './projects';
import { pendingActions, showBox } from './boxes';
import { loadBox } from './boxRef';
import type { Accepted } from './operations';

/**
 * Data volumes (docs/data.md): a dataset on one node, attached to boxes of one project (the
 * creator's, or the first box it is attached to), bound into them at their next start. Short
 * jobs (create, snapshot, deletes) are waited for; backups and restores answer 202.
 */

/** How long the api waits for a short volume job before answering 202 (DESIGN.md §6: 30 s). */
export const DATA_WAIT_MS = 30_000;
/** Deletes answer 204 (DESIGN.md §6): they wait longer (a busy dataset is retried for seconds)
 *  before falling back to 202 + operation. */
export const DATA_DELETE_WAIT_MS = 120_000;

export const volumePath = (name: string) => `/v1/data/${name}`;
export const newVolumeId = () => `v${randomId(19)}`;

/** The volume, if this caller may see it (else 404, whether it exists or not). */
export async function loadVolume(ctx: Pick<DomainContext, 'db'>, identity: Identity, name: string): Promise<VolumeRow> {
  const row = await findVolume(ctx, identity, name);
  if (!row) throw notFound(`data volume ${name}`);
  return row;
}

/** Used bytes as the node says now (the last known figure while it does not answer). */
async function usedBytes(ctx: DomainContext, row: VolumeRow): Promise<number> {
  if (row.state !== 'ready') return Number(row.size_bytes);
  try {
    if ((await ctx.nodes.downNodes([row.node])).has(row.node)) return Number(row.size_bytes);
    return (await (await ctx.nodes.client(row.node)).volumeInfo(row.id)).usedBytes;
  } catch {
    return Number(row.size_bytes);
  }
}

export async function showVolumes(ctx: DomainContext, rows: VolumeRow[]): Promise<DataVolume[]> {
  const attachments = rows.length ? await volumesRepo.attachments(ctx.db, rows.map((r) => r.id)) : [];
  return Promise.all(rows.map(async (r) => ({
    name: r.name,
    created_at: r.created_at,
    updated_at: r.updated_at,
    size_bytes: await usedBytes(ctx, r),
    quota_gb: r.quota_gb,
    description: r.description,
    attachments: attachments.filter((a) => a.volume_id === r.id).map(toAttachment),
    project: r.project,
    node: r.node,
  })));
}

export async function listVolumes(ctx: DomainContext, identity: Identity): Promise<DataVolume[]> {
  return showVolumes(ctx, await volumesRepo.list(ctx.db, identity.projects));
}

export async function getVolume(ctx: DomainContext, identity: Identity, name: string): Promise<DataVolume> {
  return (await showVolumes(ctx, [await loadVolume(ctx, identity, name)]))[0];
}

/**
 * The boxes that hold a volume: those it is attached to, and those it was detached from while
 * they ran and that still run (a lingering row of a box that stopped since is stale). With each,
 * the status its box will have once its queued operations ran.
 */
export async function holdersOf(db: DomainContext['db'], volumeId: string): Promise<(AttachmentRow & { projected: string })[]> {
  const out: (AttachmentRow & { projected: string })[] = [];
  for (const a of await volumesRepo.holders(db, volumeId)) {
    const box = await boxesRepo.byId(db, a.box_id);
    if (!box) continue;
    const projected = projectedStatus(box.status, await pendingActions(db, box.id));
    const mounted = VOLUME_HOLDING_STATUSES.has(box.status) || VOLUME_HOLDING_STATUSES.has(projected) || projected === 'running';
    if (a.detached && !mounted) continue;
    out.push({ ...a, projected });
  }
  return out;
}

/** Queues a job on the volume's node, in turn with the volume's other operations. */
export const enqueueVolumeJob = <P>(ctx: DomainContext, trx: DomainContext['db'], vol: VolumeRow, msg: JobMessage<P>, identity: Identity, resource = volumePath(vol.name)) =>
  ctx.queue.enqueue(trx, msg, { resource, node: vol.node, project: vol.project ?? identity.projects?.[0], boxId: volumeTurnKey(vol.id), createdBy: identity.name });

/** Unfinished operations of a volume, in arrival order. */
export const pendingVolumeOps = (db: DomainContext['db'], volumeId: string): Promise<OperationRow[]> => operationsRepo.unfinishedForBox(db, volumeTurnKey(volumeId));

/** Waits for a short job: true once it succeeded; false when it is still going after `ms`. A
 *  failure is a 409 when `refused` says the resource moved on, else 500 with its reason. */
export async function awaitShortJob(ctx: DomainContext, op: OperationRow, what: string, ms = DATA_WAIT_MS): Promise<boolean> {
  const done = await ctx.queue.waitFor(op.id, ms);
  if (!done || done.status === 'queued' || done.status === 'running') return false;
  if (done.status === 'succeeded') return true;
  // Refused at its turn (the volume deleted or changed meanwhile): 409; else the node failed: 500.
  const refused = /deleted before|was forgotten|being restored|taken after|has no snapshot/.test(done.error ?? '');
  throw new BoxhostError(refused ? 'conflict' : 'internal', `${what} failed: ${done.error ?? 'it failed'}`);
}

export type Made<T> = { done: T } | { accepted: Accepted<T> };

/**
 * Creates a volume (201 once its dataset is made; 202 + operation past 30 s). Its node is the
 * one with the most room that can hold its quota; a project-limited token's volume is its
 * (first) project's, as is one whose `project` is given.
 */
export async function createVolume(ctx: DomainContext, identity: Identity, req: CreateDataVolumeRequest): Promise<Made<DataVolume>> {
  let project = req.project ?? null;
  if (identity.projects !== null) {
    if (project !== null) assertProject(identity, project, `project ${project}`);
    project ??= identity.projects[0];
  }
  if (await volumesRepo.byName(ctx.db, req.name)) throw conflict(`data volume ${req.name} already exists`);
  const quotaGb = req.size_gb ?? ctx.config.dataDefaultGb;
  const node = await ctx.nodes.place(ctx.config.region, { cpus: 0, ram_mb: 0, storage_gb: quotaGb }).catch((e: unknown) => {
    // The room a volume asks for is its `size_gb`: the refusal names that field, not a box's.
    if (!(e instanceof BoxhostError)) throw e;
    throw new BoxhostError(e.code, e.message, e.details.map((d) => (d.field === 'config.storage_gb' ? { ...d, field: 'size_gb' } : d)), e.headers);
  });
  const at = now();
  const row: VolumeRow = {
    id: newVolumeId(), name: req.name, project, node, state: 'creating', quota_gb: quotaGb, description: req.description ?? null,
    size_bytes: 0, created_by: identity.name, created_at: at, updated_at: at,
  };
  let op: OperationRow;
  try {
    op = await ctx.db.transaction(async (trx) => {
      if (project !== null) {
        // The project's row is what the quota check locks: made first, so creates at the edge count in turn.
        await assertQuota(ctx, trx, await ensureProject(ctx, trx, project, { lock: true }), { boxes: 0, cpus: 0, ram_mb: 0, storage_gb: quotaGb, volumes: 1 });
      }
      await volumesRepo.insert(trx, row);
      return enqueueVolumeJob(ctx, trx, row, dataJobs.create.of({ volumeId: row.id, quotaGb }), identity);
    });
  } catch (e) {
    if (/unique|duplicate/i.test((e as Error).message)) throw conflict(`data volume ${req.name} already exists`);
    throw e;
  }
  const load = async () => {
    const r = await volumesRepo.byId(ctx.db, row.id);
    return r ? (await showVolumes(ctx, [r]))[0] : null;
  };
  if (await awaitShortJob(ctx, op, `creating data volume ${req.name}`)) return { done: (await load())! };
  return { accepted: { operation: op, load } };
}

/** Deletes a volume with its snapshots and backups (204); 409 while attached to any box. */
export async function deleteVolume(ctx: DomainContext, identity: Identity, name: string): Promise<Made<null>> {
  const current = await loadVolume(ctx, identity, name);
  if (identity.projects !== null && current.project === null) throw forbidden(`data volume ${name} has no project; only a token without a project limit can delete it`);
  await ctx.nodes.assertUp(current.node);
  const op = await ctx.db.transaction(async (trx) => {
    const vol = await volumesRepo.lock(trx, current.id);
    if (!vol) throw notFound(`data volume ${name}`);
    if (vol.state !== 'ready') throw notReady(vol);
    const attached = await holdersOf(trx, vol.id);
    if (attached.length > 0) {
      const why = (a: AttachmentRow) => (a.detached ? `still mounted in box ${a.project}/${a.box} (detached while it runs) until it stops` : `attached to box ${a.project}/${a.box} at ${a.path}`);
      throw new BoxhostError('conflict', `data volume ${name} is ${attached.map(why).join('; ')}; detach it (and stop the box) first`,
        attached.map((a) => ({ field: 'name', issue: why(a) })));
    }
    await volumesRepo.update(trx, vol.id, { state: 'deleting' });
    return enqueueVolumeJob(ctx, trx, vol, dataJobs.delete.of({ volumeId: vol.id }), identity);
  });
  if (await awaitShortJob(ctx, op, `deleting data volume ${name}`, DATA_DELETE_WAIT_MS)) return { done: null };
  return { accepted: { operation: op, load: async () => null } };
}

/**
 * Attaches a volume to a box (200, the Box). It is bound in at the box's next start: a running
 * box gets it after a stop and a resume (docs/data.md "Attach and detach").
 */
export async function attachVolume(ctx: DomainContext, identity: Identity, name: string, req: AttachDataRequest): Promise<Box> {
  const vol0 = await loadVolume(ctx, identity, name);
  const box0 = await loadBox(ctx, identity, req.project, req.box);
  const boxId = await ctx.db.transaction(async (trx) => {
    const box = await loadBox({ db: trx }, identity, req.project, req.box, { lock: true });
    const vol = await volumesRepo.lock(trx, vol0.id);
    if (!vol) throw notFound(`data volume ${name}`);
    if (box.status === 'deleting' || box.status === 'failed') throw conflict(`box ${req.project}/${req.box} is ${box.status}`);
    checkAttach(vol, box, req.path);
    const mounts = await recordAttach(ctx, trx, vol, box, { name, path: req.path, read_only: req.read_only ?? false });
    await boxesRepo.update(trx, box.id, { data_mounts: mounts });
    return box.id;
  });
  return showBox(ctx, (await boxesRepo.byId(ctx.db, boxId)) ?? box0);
}

/** Detaches a volume from a box (200, the Box); a running box that mounted it keeps it mounted until its next stop. */
export async function detachVolume(ctx: DomainContext, identity: Identity, name: string, req: DetachDataRequest): Promise<Box> {
  const vol = await loadVolume(ctx, identity, name);
  const box0 = await loadBox(ctx, identity, req.project, req.box);
  await ctx.db.transaction(async (trx) => {
    const box = await loadBox({ db: trx }, identity, req.project, req.box, { lock: true });
    if (!box.data_mounts.some((m) => m.name === name)) throw conflict(`data volume ${name} is not attached to box ${req.project}/${req.box}`);
    // A box that runs keeps the mount until it stops: the volume stays held by it till then,
    // unless its container started before the attach and never mounted it.
    await volumesRepo.detach(trx, vol.id, box.id, VOLUME_HOLDING_STATUSES.has(box.status));
    await boxesRepo.update(trx, box.id, { data_mounts: box.data_mounts.filter((m) => m.name !== name) });
  });
  return showBox(ctx, (await boxesRepo.byId(ctx.db, box0.id)) ?? box0);
}
