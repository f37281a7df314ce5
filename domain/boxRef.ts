/** A box named by project and name, as every domain action first finds it. */
import type { DomainContext, Identity } from './context';
import { boxesRepo, BoxRecord } from '../db/repos/boxes';
import { notFound } from '../core/errors';
import { assertProject } from './access';

/** A box's resource path: what its operations name (`resource`) and the api answers as `location`. */
export const boxPath = (project: string, name: string) => `/v1/projects/${project}/boxes/${name}`;

/** The box `project/name`, which `identity` may reach: 404 when there is none, and for another project's alike (domain/access.ts: as if it did not exist). */
export async function loadBox(ctx: Pick<DomainContext, 'db'>, identity: Identity, project: string, name: string, opts: { lock?: boolean } = {}): Promise<BoxRecord> {
  assertProject(identity, project, `box ${project}/${name}`);
  const box = await boxesRepo.get(ctx.db, project, name, opts);
  if (!box) throw notFound(`box ${project}/${name}`);
  return box;
}
