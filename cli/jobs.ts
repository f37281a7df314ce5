import type { Operation } from '../core/apiTypes';
import type { ApiResponse } from './client';
import { apiPath } from './client';
import type { Ctx } from './context';
import { note, Progress, say } from './output';

export type { Operation };

export const isFinished = (op: Operation) => op.status === 'succeeded' || op.status === 'failed';

/** How a job-backed command talks about itself: `creating box web… 50%`, `created box web`. */
export interface JobLabel {
  /** `creating` */
  doing: string;
  /** `created` */
  done: string;
  /** `box web` */
  what: string;
}

const POLL_MS = 500;

/** Raised when a waited-for operation ends in `failed`. */
export class OperationFailed extends Error {
  constructor(readonly operation: Operation, label: JobLabel) {
    super(`${label.doing} ${label.what} failed: ${operation.error ?? 'no reason given'} (operation ${operation.id})`);
  }
}

/**
 * The tail of every job-backed command (create, fork, stop, resume, rm): the api answered the
 * one call with 202 + `Operation-Id`. Without `wait`, show the answer and the operation id;
 * with `wait`, poll `GET /v1/operations/{id}` with progress on stderr until it finishes.
 */
export async function finishJob<T>(ctx: Ctx, res: ApiResponse<T>, label: JobLabel, wait: boolean, show: (body: T) => void): Promise<void> {
  const opId = firstHeader(res.headers['operation-id']);
  if (!wait || !opId) {
    ctx.show(res.body, (body) => {
      if (body !== undefined) show(body);
      if (opId) say(`operation: ${opId} (follow it with: box op wait ${opId})`);
    });
    if (ctx.json && opId) note(`operation: ${opId}`);
    return;
  }
  const op = await pollOperation(ctx, opId, label);
  if (op.status === 'failed') throw new OperationFailed(op, label);
  ctx.show(op, () => say(`${label.done} ${label.what}`));
}

/** Polls an operation until it is succeeded or failed; progress goes to stderr. */
export async function pollOperation(ctx: Ctx, id: string, label: JobLabel): Promise<Operation> {
  const progress = new Progress();
  try {
    for (;;) {
      const op = (await ctx.client.get<Operation>(apiPath('v1', 'operations', id))).body;
      if (isFinished(op)) {
        progress.done(op.status === 'succeeded' ? `${label.doing} ${label.what}… done` : `${label.doing} ${label.what}… failed`);
        return op;
      }
      const state = op.status === 'queued' ? 'queued' : op.progress !== null ? `${op.progress}%` : 'running';
      progress.update(`${label.doing} ${label.what}… ${state}`);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  } finally {
    progress.done();
  }
}

const firstHeader = (h: string | string[] | undefined) => (Array.isArray(h) ? h[0] : h);
