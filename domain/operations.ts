import type { DomainContext, Identity } from './context';
import { decodeSeqCursor, encodeSeqCursor } from './seqCursor';
import { OperationRow, operationsRepo, isFinished } from '../db/repos/operations';
import { invalidField, notFound, timeoutError } from '../core/errors';
import type { Operation, OperationList } from '../core/apiTypes';
import type { OperationStatus } from '../db/repos/operations';
import { boxesRepo } from '../db/repos/boxes';
import { boxPath } from './boxRef';
import { assertProject, canSeeProject } from './access';
import { DEFAULT_PAGE } from './paging';

/** A job-backed request taken: its operation, and how to read the resource it works on (null
 *  once the operation removed it). The api answers 202 with both (or waits, with `?wait`). */
export interface Accepted<T> {
  operation: OperationRow;
  load(): Promise<T | null>;
}

/** The Operations of DESIGN.md §3. One still waiting on a node that is down says so in `error`
 *  (the nodes of a page are asked once). */
export async function showOperations(ctx: DomainContext, rows: OperationRow[]): Promise<Operation[]> {
  const waiting = [...new Set(rows.filter((r) => !isFinished(r.status) && r.node).map((r) => r.node!))];
  const down = waiting.length ? await ctx.nodes.downNodes(waiting) : new Map<string, string>();
  return rows.map((r) => {
    const why = !isFinished(r.status) && r.node ? down.get(r.node) : undefined;
    return { id: r.id, kind: r.kind, status: r.status, resource: r.resource, progress: r.progress, error: why ? `waiting: ${why}` : r.error, created_at: r.created_at, updated_at: r.updated_at };
  });
}

export const showOperation = async (ctx: DomainContext, r: OperationRow): Promise<Operation> => (await showOperations(ctx, [r]))[0];

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

/** The query of `GET /v1/operations`. */
export interface ListOperationsQuery {
  project?: string;
  box?: string;
  /** Comma-separated statuses. */
  status?: string;
  kind?: string;
  max_results?: number;
  continuation_token?: string;
}

/**
 * Operations newest first, as `lxc operation list` shows them, finished ones too while they are
 * kept (docs/decisions.md "Operations"). A project-limited token sees its projects' operations
 * only; host-wide ones (a base import with an unlimited token) only an unlimited token sees. A
 * box is named within its project; its operations are found by its id and by its path, so a
 * deleted box's show too.
 */
export async function listOperations(ctx: DomainContext, identity: Identity, q: ListOperationsQuery): Promise<OperationList> {
  if (q.project) assertProject(identity, q.project, `project ${q.project}`);
  if (q.box && !q.project) throw invalidField('box', 'needs project: a box is named within its project');
  const limit = q.max_results || DEFAULT_PAGE;
  let box: { id?: string; resource: string } | undefined;
  if (q.box && q.project) box = { id: (await boxesRepo.get(ctx.db, q.project, q.box))?.id, resource: boxPath(q.project, q.box) };
  const rows = await operationsRepo.page(ctx.db, {
    projects: identity.projects, project: q.project, box, kind: q.kind,
    statuses: q.status ? ([...new Set(q.status.split(','))] as OperationStatus[]) : undefined,
    beforeSeq: q.continuation_token ? decodeSeqCursor(q.continuation_token) : undefined, limit,
  });
  const page = rows.slice(0, limit);
  const hasMore = rows.length > limit;
  return {
    operations: await showOperations(ctx, page),
    has_more: hasMore,
    next_continuation_token: hasMore ? encodeSeqCursor(page[page.length - 1].seq) : null,
  };
}

/** How long a finished operation stays readable (BOXHOST_OPERATIONS_KEEP_DAYS). */
export async function pruneOperations(ctx: Pick<DomainContext, 'db'>, keepDays: number, nowMs = Date.now()): Promise<number> {
  return operationsRepo.pruneFinished(ctx.db, new Date(nowMs - keepDays * 86_400_000).toISOString());
}
