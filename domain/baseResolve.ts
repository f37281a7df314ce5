import type { DomainContext, Identity } from './context';
import { basesRepo, type BaseRow } from '../db/repos/bases';
import { canSeeProject } from './access';

/** A saved base is seen only by tokens that reach its project. */
export const visible = (identity: Identity | null, r: BaseRow) => r.project === null || identity === null || canSeeProject(identity, r.project);

/**
 * `name` is its newest version, `name@version` a pinned one; a base of another project is not
 * found. `project`: the project a box would be made in (a saved base seeds only its own).
 */
export async function resolveBase(ctx: Pick<DomainContext, 'db'>, identity: Identity | null, spec: string, project?: string): Promise<BaseRow | undefined> {
  const [name, version] = spec.split('@');
  const row = version ? await basesRepo.get(ctx.db, name, version) : await basesRepo.newest(ctx.db, name);
  if (!row || !visible(identity, row) || (project !== undefined && row.project !== null && row.project !== project)) return undefined;
  return row;
}

