import type { ApiContext, Identity } from '../context';
import { operationsRepo, toOperation, isFinished } from '../../db/repos/operations';
import { ApiError, notFound } from '../http/errors';
import { canSeeProject } from './access';

/** A project-limited token sees only operations on resources of its projects. */
function visible(identity: Identity, resource: string): boolean {
  if (identity.projects === null) return true;
  const m = /^\/v1\/projects\/([^/]+)\//.exec(resource);
  return m !== null && canSeeProject(identity, m[1]);
}

export async function getOperation(api: ApiContext, identity: Identity, id: string) {
  const row = await operationsRepo.get(api.db, id);
  if (!row || !visible(identity, row.resource)) throw notFound(`operation ${id}`);
  return toOperation(row);
}

export async function waitOperation(api: ApiContext, identity: Identity, id: string, timeoutSeconds: number) {
  await getOperation(api, identity, id);
  const row = (await api.queue.waitFor(id, timeoutSeconds * 1000))!;
  if (!isFinished(row.status)) {
    throw new ApiError(408, 'timeout', `operation ${id} is still ${row.status} after ${timeoutSeconds} s`);
  }
  return toOperation(row);
}
