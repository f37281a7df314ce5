import Joi from 'joi';
import type { OperationRow } from '../../db/repos/operations';
import type { Accepted } from '../../domain/operations';
import type { ApiContext } from '../context';
import type { Reply } from './route';

/** `?wait=SECONDS` on every job-backed route. */
export const waitQuery = { wait: Joi.number().min(0).max(300).description('wait up to this many seconds for the operation to finish') };

export const operationHeaders = (op: OperationRow) => ({ Location: op.resource, 'Operation-Id': op.id });

/**
 * The 202 + operation answer of DESIGN.md §3. With `wait`, the api waits for the operation and
 * answers the finished resource (200) — or 204 when the operation removed it — if it finishes
 * in time; otherwise the 202 as usual.
 */
export async function acceptedReply<T>(api: ApiContext, accepted: Accepted<T>, waitSeconds?: number): Promise<Reply> {
  const headers = operationHeaders(accepted.operation);
  if (waitSeconds) {
    const done = await api.queue.waitFor(accepted.operation.id, waitSeconds * 1000);
    if (done && (done.status === 'succeeded' || done.status === 'failed')) {
      const resource = await accepted.load();
      return resource === null ? { status: 204, headers } : { status: 200, body: resource, headers };
    }
  }
  return { status: 202, body: (await accepted.load()) ?? undefined, headers };
}
