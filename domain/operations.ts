import type { DomainContext, Identity } from './context';
import { OperationRow, operationsRepo, isFinished } from '../db/repos/operations';
import { notFound, timeoutError } from '../core/errors';
import type { Operation } from '../core/apiTypes';
import { canSeeProject } from './access';

/** A job-backed request taken: its operation, and how to read the resource it works on (null
 *  once the operation removed it). The api answers 202 with both (or waits, with `?wait`). */
export interface Accepted<T> {
  operation: OperationRow;
  load(): Promise<T | null>;
}

/** The Operation of DESIGN.md §3. One still waiting on a node that is down says so in `error`. */
export async function showOperation(ctx: DomainContext, r: OperationRow): Promise<Operation> {
  let error = r.error;
  if (!isFinished(r.status) && r.node) {
    const down = (await ctx.nodes.downNodes([r.node])).get(r.node);
    if (down) error = `waiting: ${down}`;
  }
  return { id: r.id, kind: r.kind, status: r.status, resource: r.resource, progress: r.progress, error, created_at: r.created_at, updated_at: r.updated_at };
}

/** The shape of every operation id (`newId('op')`). */
export const OPERATION_ID_PATTERN = /^op_[a-z0-9]{1,40}$/;

/** A project-limited token sees only its projects' operations (the `project` column). An id of
 *  another shape cannot exist: it is unknown (404) like any other, without a db read. */
async function visibleRow(ctx: DomainContext, identity: Identity, id: string): Promise<OperationRow> {
  const row = OPERATION_ID_PATTERN.test(id) ? await operationsRepo.get(ctx.db, id) : undefined;
  const visible = row && (identity.projects === null || (row.project !== null && canSeeProject(identity, row.project)));
  if (!visible) throw notFound(`operation ${OPERATION_ID_PATTERN.test(id) ? id : JSON.stringify(id.slice(0, 64))}`);
  return row;
}

export async function getOperation(ctx: DomainContext, identity: Identity, id: string): Promise<Operation> {
  return showOperation(ctx, await visibleRow(ctx, identity, id));
}

export async function waitOperation(ctx: DomainContext, identity: Identity, id: string, timeoutSeconds: number): Promise<Operation> {
  await visibleRow(ctx, identity, id);
  const row = (await ctx.queue.waitFor(id, timeoutSeconds * 1000))!;
  if (!isFinished(row.status)) throw timeoutError(`operation ${id} is still ${row.status} after ${timeoutSeconds} s`);
  return showOperation(ctx, row);
}
