import type { DomainContext, Identity } from './context';
import type { BoxSnapshot, CreateBoxSnapshotRequest } from '../core/apiTypes';
import type { BoxSnapshotInfo, NodeClient } from '../cluster/types';
import type { BoxRecord } from '../db/repos/boxes';
import type { OperationRow } from '../db/repos/operations';
import { boxesRepo } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { canSnapshot, describeState, projectedStatus } from '../core/box';
import { BoxhostError, conflict, notFound } from '../core/errors';
import { boxJobs, boxSnapshotJob, BoxRestorePayload, BoxSnapshotPayload } from '../jobs/boxJobs';
import { enqueueBoxJob, pendingActions, queueBoxAction, reload } from './boxes';
import { loadBox } from './boxRef';
import type { Accepted } from './operations';
import type { Box } from '../core/apiTypes';

/** How long the api waits for a snapshot job before answering 202 (DESIGN.md §6: 30 s). */
export const SNAPSHOT_WAIT_MS = 30_000;

export const toApiSnapshot = (s: BoxSnapshotInfo): BoxSnapshot => ({
  name: s.name,
  created_at: s.createdAt,
  size_bytes: s.sizeBytes,
  ...(s.description ? { description: s.description } : {}),
});

/** A box whose root may not exist (still being made, a failed create, on its way out) lists
 *  no snapshots rather than failing. */
const MAY_LACK_ROOT = new Set(['creating', 'failed', 'deleting']);

async function snapshotsOf(node: NodeClient, box: BoxRecord): Promise<BoxSnapshotInfo[]> {
  try {
    return await node.listSnapshots(box.id);
  } catch (e) {
    if (MAY_LACK_ROOT.has(box.status) && !(e instanceof BoxhostError && e.code === 'unavailable')) return [];
    throw e;
  }
}

async function boxAndSnapshots(ctx: DomainContext, identity: Identity, project: string, name: string) {
  const box = await loadBox(ctx, identity, project, name);
  const node = await ctx.nodes.client(box.node);
  return { box, node, snapshots: await snapshotsOf(node, box) };
}

const pendingOps = (ops: OperationRow[], kind: string) =>
  ops.filter((o) => o.kind === kind).map((o) => JSON.parse(o.payload) as Record<string, unknown>);

export async function listSnapshots(ctx: DomainContext, identity: Identity, project: string, name: string): Promise<BoxSnapshot[]> {
  return (await boxAndSnapshots(ctx, identity, project, name)).snapshots.map(toApiSnapshot);
}

export async function getSnapshot(ctx: DomainContext, identity: Identity, project: string, name: string, snapshot: string): Promise<BoxSnapshot> {
  const { snapshots } = await boxAndSnapshots(ctx, identity, project, name);
  const found = snapshots.find((s) => s.name === snapshot);
  if (!found) throw notFound(`snapshot ${snapshot} of box ${project}/${name}`);
  return toApiSnapshot(found);
}

/** A snapshot taken: its record (201), or its operation when it took longer than the wait. */
export type SnapshotTaken = { snapshot: BoxSnapshot } | { accepted: Accepted<Box> };

/**
 * Takes a snapshot of a box's root as a job on the box's node, in turn with the box's other
 * operations (judged on the status the box will have when its turn comes), and waits for it.
 * A name in use, or one a queued snapshot takes, is a 409.
 */
export async function createSnapshot(ctx: DomainContext, identity: Identity, project: string, name: string, req: CreateBoxSnapshotRequest, waitMs = SNAPSHOT_WAIT_MS): Promise<SnapshotTaken> {
  const { box: current, snapshots } = await boxAndSnapshots(ctx, identity, project, name);
  await ctx.nodes.assertUp(current.node);
  if (snapshots.some((s) => s.name === req.name)) throw conflict(`box ${project}/${name} already has a snapshot ${req.name}`);
  const operation = await ctx.db.transaction(async (trx) => {
    const box = await loadBox({ db: trx }, identity, project, name, { lock: true });
    const ops = await operationsRepo.unfinishedForBox(trx, box.id);
    const projected = projectedStatus(box.status, await pendingActions(trx, box.id));
    if (box.status === 'creating' || !canSnapshot(projected)) {
      const shown = box.status === 'creating' ? 'creating' : describeState(box.status, projected);
      throw conflict(`box ${project}/${name} is ${shown}; it can be snapshotted when running or stopped`);
    }
    const queued = pendingOps(ops, boxSnapshotJob.kind);
    if (queued.some((p) => p.name === req.name)) throw conflict(`a snapshot ${req.name} of box ${project}/${name} is already being taken`);
    // Each holds the blocks its root changed since: a bound per box (BOXHOST_SNAPSHOTS_MAX_PER_BOX).
    const most = ctx.config.snapshotsPerBox;
    if (snapshots.length + queued.length >= most) throw conflict(`box ${project}/${name} has ${most} snapshots, the most a box keeps; delete one first`);
    const payload: BoxSnapshotPayload = { boxId: box.id, name: req.name, ...(req.description ? { description: req.description } : {}) };
    return enqueueBoxJob(ctx, trx, box, boxSnapshotJob.of(payload), identity);
  });
  const done = await ctx.queue.waitFor(operation.id, waitMs);
  if (done?.status === 'succeeded') return { snapshot: await getSnapshot(ctx, identity, project, name, req.name) };
  if (done?.status === 'failed') {
    // Refused at its turn (the box gone, or no longer running or stopped): 409. Anything else
    // failed on the node (storage): 500 with the public reason the worker recorded.
    const now = await boxesRepo.byId(ctx.db, current.id);
    const why = `snapshot ${req.name} of box ${project}/${name} was not taken: ${done.error ?? 'it failed'}`;
    throw !now || !canSnapshot(now.status) ? conflict(why) : new BoxhostError('internal', why);
  }
  return { accepted: { operation, load: reload(ctx, current.id) } };
}

/**
 * Brings a box back to a snapshot (202 + operation): its container stops, its root rolls back,
 * it runs again. Refused with 409, before anything is queued, while snapshots taken after it or
 * boxes forked after it depend on what the rollback would destroy (named in the answer).
 */
export async function restoreSnapshot(ctx: DomainContext, identity: Identity, project: string, name: string, snapshot: string): Promise<Accepted<Box>> {
  const { box, node, snapshots } = await boxAndSnapshots(ctx, identity, project, name);
  if (!snapshots.some((s) => s.name === snapshot)) throw notFound(`snapshot ${snapshot} of box ${project}/${name}`);
  await ctx.nodes.assertUp(box.node);
  const blockers = await node.restoreBlockers(box.id, snapshot);
  const forks = await Promise.all(blockers.forks.map(async (id) => (await boxesRepo.byId(ctx.db, id))?.name ?? `a deleted box's fork (${id})`));
  const names = [...blockers.snapshots.map((n) => `snapshot ${n}`), ...forks.map((f) => `fork ${f}`)];
  if (names.length > 0) {
    throw new BoxhostError('conflict', `cannot restore box ${project}/${name} to ${snapshot}: ${names.join(', ')} ${names.length === 1 ? 'was' : 'were'} made after it and would be lost; delete ${names.length === 1 ? 'it' : 'them'} first`,
      names.map((n) => ({ field: 'snapshot', issue: `${n} depends on the state after ${snapshot}` })));
  }
  return queueBoxAction(ctx, identity, project, name, 'restore', (b, from) =>
    boxJobs.restore.of({ boxId: b.id, snapshot, ...(from === 'running' || from === 'stopped' ? { from } : {}) } satisfies BoxRestorePayload));
}

/** Removes a snapshot (204). Forks made from it keep working. Refused while a queued restore
 *  goes to it. */
export async function deleteSnapshot(ctx: DomainContext, identity: Identity, project: string, name: string, snapshot: string): Promise<void> {
  const { box, node, snapshots } = await boxAndSnapshots(ctx, identity, project, name);
  if (!snapshots.some((s) => s.name === snapshot)) throw notFound(`snapshot ${snapshot} of box ${project}/${name}`);
  const restores = pendingOps(await operationsRepo.unfinishedForBox(ctx.db, box.id), boxJobs.restore.kind);
  if (restores.some((p) => p.snapshot === snapshot)) throw conflict(`box ${project}/${name} is being restored to ${snapshot}; delete it once that is done`);
  // A fork of it still being made needs it until its clone exists.
  const forks = pendingOps(await operationsRepo.unfinishedOnNode(ctx.db, box.node), boxJobs.create.kind);
  if (forks.some((p) => { const src = p.source as { kind?: string; boxId?: string; snapshot?: string } | undefined; return src?.kind === 'box' && src.boxId === box.id && src.snapshot === snapshot; })) {
    throw conflict(`a box is being forked from ${name}@${snapshot}; delete the snapshot once that is done`);
  }
  await node.deleteSnapshot(box.id, snapshot);
}
