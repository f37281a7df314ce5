import crypto from 'node:crypto';
import type { DomainContext, Identity } from './context';
import type { CreateDataBackupRequest, CreateDataSnapshotRequest, DataBackup, DataSnapshot, DataVolume, RestoreDataRequest } from '../core/apiTypes';
import { volumesRepo, type BackupRow, type VolumeRow } from '../db/repos/volumes';
import { boxesRepo } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { allowed } from '../core/box';
import { boxJobs } from '../jobs/boxJobs';
import { enqueueBoxJob, pendingActions } from './boxes';
import { BoxhostError, conflict, forbidden, notFound } from '../core/errors';
import { newId, now } from '../core/ids';
import { dataJobs } from '../jobs/dataJobs';
import { toApiSnapshot } from './snapshots';
import { notReady } from './volumeAttach';
import { awaitShortJob, DATA_DELETE_WAIT_MS, enqueueVolumeJob, holdersOf, loadVolume, pendingVolumeOps, showVolumes, volumePath, type Made } from './volumes';
import { VOLUME_HOLDING_STATUSES } from '../core/box';

/**
 * A volume's snapshots, backups and restores (docs/data.md). Snapshots live on the volume's
 * node (read from it); backups are rows here and streams in the backup directory.
 */

async function nodeInfo(ctx: DomainContext, vol: VolumeRow) {
  if (vol.state === 'creating') return { usedBytes: 0, snapshots: [] };
  await ctx.nodes.assertUp(vol.node);
  return (await ctx.nodes.client(vol.node)).volumeInfo(vol.id);
}

export async function listDataSnapshots(ctx: DomainContext, identity: Identity, name: string): Promise<DataSnapshot[]> {
  return (await nodeInfo(ctx, await loadVolume(ctx, identity, name))).snapshots.map(toApiSnapshot);
}

const queuedOf = async (ctx: DomainContext, vol: VolumeRow, kind: string) =>
  (await pendingVolumeOps(ctx.db, vol.id)).filter((o) => o.kind === kind).map((o) => JSON.parse(o.payload) as Record<string, unknown>);

/** Snapshots a volume (201 with the snapshot; 202 + operation past 30 s). A name in use → 409. */
export async function createDataSnapshot(ctx: DomainContext, identity: Identity, name: string, req: CreateDataSnapshotRequest): Promise<Made<DataSnapshot | DataVolume>> {
  const vol = await loadVolume(ctx, identity, name);
  if (vol.state !== 'ready') throw notReady(vol);
  const { snapshots } = await nodeInfo(ctx, vol);
  if (snapshots.some((s) => s.name === req.name)) throw conflict(`data volume ${name} already has a snapshot ${req.name}`);
  if ((await queuedOf(ctx, vol, dataJobs.snapshot.kind)).some((p) => p.name === req.name)) throw conflict(`a snapshot ${req.name} of data volume ${name} is already being taken`);
  if (snapshots.length >= ctx.config.snapshotsPerBox) throw conflict(`data volume ${name} has ${snapshots.length} snapshots, the most one keeps (BOXHOST_SNAPSHOTS_MAX_PER_BOX); delete one first`);
  const op = await ctx.db.transaction((trx) => enqueueVolumeJob(ctx, trx, vol, dataJobs.snapshot.of({ volumeId: vol.id, name: req.name, ...(req.description ? { description: req.description } : {}) }), identity));
  const load = async () => {
    const r = await volumesRepo.byId(ctx.db, vol.id);
    return r ? (await showVolumes(ctx, [r]))[0] : null;
  };
  if (!(await awaitShortJob(ctx, op, `snapshot ${req.name} of data volume ${name}`))) return { accepted: { operation: op, load } };
  const made = (await nodeInfo(ctx, vol)).snapshots.find((s) => s.name === req.name);
  if (!made) throw new BoxhostError('internal', `snapshot ${req.name} of data volume ${name} was taken but is not listed`);
  return { done: toApiSnapshot(made) };
}

/** Removes a snapshot (204). Refused while a queued restore goes to it. */
export async function deleteDataSnapshot(ctx: DomainContext, identity: Identity, name: string, snapshot: string): Promise<Made<null>> {
  const vol = await loadVolume(ctx, identity, name);
  const { snapshots } = await nodeInfo(ctx, vol);
  if (!snapshots.some((s) => s.name === snapshot)) throw notFound(`snapshot ${snapshot} of data volume ${name}`);
  if ((await queuedOf(ctx, vol, dataJobs.restore.kind)).some((p) => p.snapshot === snapshot)) throw conflict(`data volume ${name} is being restored to ${snapshot}; delete it once that is done`);
  const op = await ctx.db.transaction((trx) => enqueueVolumeJob(ctx, trx, vol, dataJobs.deleteSnapshot.of({ volumeId: vol.id, name: snapshot }), identity));
  if (await awaitShortJob(ctx, op, `deleting snapshot ${snapshot} of data volume ${name}`, DATA_DELETE_WAIT_MS)) return { done: null };
  return { accepted: { operation: op, load: async () => null } };
}

// ------------------------------------------------------------------ backups

export const toApiBackup = (r: BackupRow): DataBackup => ({
  name: r.name,
  status: r.status,
  created_at: r.created_at,
  updated_at: r.updated_at,
  description: r.description,
  error: r.error,
  mode: r.mode,
  parent: r.parent,
  size_bytes: r.size_bytes === null ? null : Number(r.size_bytes),
  sha256: r.sha256,
});

export const backupPath = (volume: string, backup: string) => `${volumePath(volume)}/backups/${backup}`;

export async function listBackups(ctx: DomainContext, identity: Identity, name: string): Promise<DataBackup[]> {
  const vol = await loadVolume(ctx, identity, name);
  return (await volumesRepo.backups(ctx.db, vol.id)).map(toApiBackup);
}

export async function getBackup(ctx: DomainContext, identity: Identity, name: string, backup: string): Promise<DataBackup> {
  const vol = await loadVolume(ctx, identity, name);
  const row = await volumesRepo.backup(ctx.db, vol.id, backup);
  if (!row) throw notFound(`backup ${backup} of data volume ${name}`);
  return toApiBackup(row);
}

/** A name that obeys the backup name rule and sorts by time: `b-20261123-041522-3f9a`. */
export const generatedBackupName = (at = new Date()) =>
  `b-${at.toISOString().slice(0, 19).replace(/[-:]/g, '').replace('T', '-')}-${crypto.randomBytes(2).toString('hex')}`;

/** Starts a backup (202 + operation; the body is the backup, `pending`). A name in use → 409. */
export async function createBackup(ctx: DomainContext, identity: Identity, name: string, req: CreateDataBackupRequest): Promise<{ backup: DataBackup; operation: Awaited<ReturnType<typeof enqueueVolumeJob>>; load: () => Promise<DataBackup | null> }> {
  const vol = await loadVolume(ctx, identity, name);
  if (vol.state !== 'ready') throw notReady(vol);
  await ctx.nodes.assertUp(vol.node);
  const backupName = req.name ?? generatedBackupName();
  const at = now();
  const row: BackupRow = {
    id: newId('bk'), volume_id: vol.id, name: backupName, status: 'pending', mode: null, parent: null, description: req.description ?? null,
    error: null, sha256: null, size_bytes: null, created_at: at, updated_at: at,
  };
  try {
    const operation = await ctx.db.transaction(async (trx) => {
      const locked = await volumesRepo.lock(trx, vol.id);
      if (!locked) throw notFound(`data volume ${name}`);
      if (locked.state !== 'ready') throw notReady(locked);
      if (await volumesRepo.backup(trx, vol.id, backupName)) throw conflict(`data volume ${name} already has a backup ${backupName}`);
      const count = (await volumesRepo.backups(trx, vol.id)).length;
      if (count >= ctx.config.backupsPerVolume) throw conflict(`data volume ${name} has ${count} backups, the most one keeps (BOXHOST_BACKUPS_MAX_PER_VOLUME); delete one first`);
      await volumesRepo.insertBackup(trx, row);
      // The locked row's node: a move that ended since the first read sends it there.
      return enqueueVolumeJob(ctx, trx, locked, dataJobs.backup.of({ volumeId: vol.id, backupId: row.id }), identity, backupPath(name, backupName));
    });
    const load = async () => {
      const r = await volumesRepo.backupById(ctx.db, row.id);
      return r ? toApiBackup(r) : null;
    };
    return { backup: toApiBackup(row), operation, load };
  } catch (e) {
    if (/unique|duplicate/i.test((e as Error).message)) throw conflict(`data volume ${name} already has a backup ${backupName}`);
    throw e;
  }
}

/**
 * Restores a volume to a snapshot or a backup (202 + operation; the body is the volume).
 * 409 while a box that has it attached runs, while later snapshots would be lost (a snapshot
 * restore), or while the backup is not completed. A backup's streams are checked against their
 * sha256 before anything is touched: a corrupt one fails the operation, the volume unchanged.
 */
export async function restoreVolume(ctx: DomainContext, identity: Identity, name: string, req: RestoreDataRequest) {
  const vol = await loadVolume(ctx, identity, name);
  if (vol.state !== 'ready') throw notReady(vol);
  const to = 'backup' in req && req.node !== undefined && req.node !== vol.node ? req.node : null;
  const released = to !== null ? await assertMovable(ctx, identity, vol, to) : undefined;
  if (to === null) await ctx.nodes.assertUp(vol.node);
  const runningHolder = to !== null ? undefined : (await holdersOf(ctx.db, vol.id)).find((a) => VOLUME_HOLDING_STATUSES.has(a.projected) || a.projected === 'running');
  if (runningHolder) {
    const { project, box, projected } = runningHolder;
    const state = projected === 'running' ? 'running' : `about to be ${projected}`;
    throw conflict(runningHolder.detached
      ? `data volume ${name} is still mounted in box ${project}/${box} (detached while it runs), which is ${state}; stop the box first`
      : `data volume ${name} is attached to box ${project}/${box}, which is ${state}; stop the box (or detach the volume) first`);
  }
  let payload;
  if ('snapshot' in req) {
    const { snapshots } = await nodeInfo(ctx, vol);
    const at = snapshots.findIndex((s) => s.name === req.snapshot);
    if (at < 0) throw notFound(`snapshot ${req.snapshot} of data volume ${name}`);
    const later = snapshots.slice(at + 1).map((s) => s.name);
    if (later.length > 0) {
      throw new BoxhostError('conflict', `cannot restore data volume ${name} to ${req.snapshot}: snapshot${later.length === 1 ? '' : 's'} ${later.join(', ')} ${later.length === 1 ? 'was' : 'were'} taken after it and would be lost; delete ${later.length === 1 ? 'it' : 'them'} first`,
        later.map((n) => ({ field: 'snapshot', issue: `snapshot ${n} was taken after ${req.snapshot}` })));
    }
    payload = { volumeId: vol.id, snapshot: req.snapshot };
  } else {
    const b = await volumesRepo.backup(ctx.db, vol.id, req.backup);
    if (!b) throw notFound(`backup ${req.backup} of data volume ${name}`);
    if (b.status !== 'completed') throw conflict(`backup ${req.backup} is ${b.status}; only a completed backup restores`);
    payload = { volumeId: vol.id, backupId: b.id, ...(to !== null ? { node: to } : {}) };
  }
  const operation = await ctx.db.transaction(async (trx) => {
    // Locked and marked: no attach, box start or second restore takes it until this one ends.
    const locked = await volumesRepo.lock(trx, vol.id);
    if (!locked) throw notFound(`data volume ${name}`);
    if (locked.state !== 'ready') throw notReady(locked);
    if (locked.node !== vol.node) throw conflict(`data volume ${name} moved to node ${locked.node} meanwhile; try again`);
    if (to !== null && (await pendingVolumeOps(trx, vol.id)).some((o) => !released!.ops.includes(o.id))) throw conflict(`data volume ${name} has operations queued; wait for them before moving it`);
    if (to !== null) await release(ctx, identity, trx, vol, to, released!);
    if (to !== null && (await volumesRepo.evictionPending(trx, vol.id, to))) throw conflict(`node ${to} has not let go of its old copy of data volume ${name} yet; try again in a few seconds`);
    await volumesRepo.update(trx, vol.id, { state: 'restoring' });
    // A move runs on the node that is to hold the volume (docs/data.md "Moving a volume").
    return enqueueVolumeJob(ctx, trx, to !== null ? { ...vol, node: to } : vol, dataJobs.restore.of(payload), identity);
  });
  const load = async () => {
    const r = await volumesRepo.byId(ctx.db, vol.id);
    return r ? (await showVolumes(ctx, [r]))[0] : null;
  };
  return { operation, load };
}

/**
 * A restore of a backup on another node moves the volume there (docs/data.md "Moving a volume
 * to another node"): the target must take it (registered, active, up, room for its quota); the
 * volume must be attached to no box (its boxes are on the old node) and have nothing queued (a
 * queued operation on a dead node would hold its turn forever). The old node may be down: that
 * is what a move is for. Only tokens without a project limit move volumes (nodes are the
 * operator's).
 */
/** What a move away from a node that is down takes over: the attachments of boxes on that
 *  node and the volume's operations queued there (none of them can run or end while it is down). */
interface Released {
  boxes: { id: string; project: string; name: string }[];
  ops: string[];
}

async function assertMovable(ctx: DomainContext, identity: Identity, vol: VolumeRow, to: string): Promise<Released> {
  // Nodes are the operator's (GET /v1/nodes is too): a project-limited token does not pick one.
  if (identity.projects !== null) throw forbidden('moving a data volume to another node takes a token without a project limit');
  await ctx.nodes.assertCanTake(to, { cpus: 0, ram_mb: 0, storage_gb: vol.quota_gb });
  // Its node down: what holds the volume there is released by the move (a volume held by a box
  // of a dead node is what a move is for); a node that is up settles them itself first.
  const sourceDown = (await ctx.nodes.downNodes([vol.node])).has(vol.node);
  const released: Released = { boxes: [], ops: [] };
  const blocking: string[] = [];
  for (const a of await volumesRepo.holders(ctx.db, vol.id)) {
    const box = await boxesRepo.byId(ctx.db, a.box_id);
    if (sourceDown && box?.node === vol.node) released.boxes.push({ id: a.box_id, project: a.project, name: a.box });
    else blocking.push(`box ${a.project}/${a.box}${a.detached ? ' (detached, mounted until it stops)' : ''}`);
  }
  if (blocking.length > 0) throw conflict(`data volume ${vol.name} is attached to ${blocking.join(', ')} on node ${vol.node}; detach it before moving it to node ${to}`);
  for (const op of await pendingVolumeOps(ctx.db, vol.id)) {
    if (sourceDown && op.node === vol.node) released.ops.push(op.id);
    else throw conflict(`data volume ${vol.name} has operations queued; wait for them before moving it`);
  }
  // Back to a node that still holds its old copy: not until that node has let go of it (its
  // sweep destroys the copy; a receive there meanwhile would race it, in another process).
  if (await volumesRepo.evictionPending(ctx.db, vol.id, to)) throw conflict(`node ${to} has not let go of its old copy of data volume ${vol.name} yet; try again in a few seconds`);
  return released;
}

/** In the move's transaction: the boxes of the dead node no longer mount the volume, its
 *  operations there are failed (a late run finds them finished and does nothing), its backups
 *  that were under way are failed, and those boxes are restarted when their node is back. */
async function release(ctx: DomainContext, identity: Identity, trx: DomainContext['db'], vol: VolumeRow, to: string, r: Released): Promise<void> {
  for (const b of r.boxes) {
    await trx('data_attachments').where({ volume_id: vol.id, box_id: b.id }).delete();
    const box = await boxesRepo.byId(trx, b.id);
    if (!box) continue;
    await boxesRepo.update(trx, b.id, { data_mounts: box.data_mounts.filter((m) => m.name !== vol.name) });
    // Still running with the old copy mounted when its node returns: restarted then (a stop and a
    // resume queued behind what it has), so it lets go of the copy its node is to destroy.
    const pending = await pendingActions(trx, box.id);
    if (allowed('stop', box.status, pending)) {
      await enqueueBoxJob(ctx, trx, box, boxJobs.stop.of({ boxId: box.id }), identity);
      await enqueueBoxJob(ctx, trx, box, boxJobs.resume.of({ boxId: box.id }), identity);
    }
  }
  const why = `lost: data volume ${vol.name} moved to node ${to} while node ${vol.node} was down`;
  for (const id of r.ops) await operationsRepo.update(trx, id, { status: 'failed', error: why });
  await trx('data_backups').where({ volume_id: vol.id }).whereIn('status', ['pending', 'running']).update({ status: 'failed', error: why, updated_at: now() });
}
