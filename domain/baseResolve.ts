import type { DomainContext, Identity } from './context';
import { basesRepo, type BaseRow } from '../db/repos/bases';
import { canSeeProject } from './access';
import { unmadeRecipe } from './recipeBases';
import { recipeNamed, recipeVersion } from '../core/recipeBases';

/** A saved base is seen only by tokens that reach its project. */
export const visible = (identity: Identity | null, r: BaseRow) => r.project === null || identity === null || canSeeProject(identity, r.project);

/**
 * `name` is its newest version, `name@version` a pinned one; a base of another project is not
 * found. `project`: the project a box would be made in (a saved base seeds only its own).
 * A recipe base's bare name (`debian`) is its current recipe version, made or not: an older
 * version some node made stays reachable pinned only (every node can make the current one).
 */
export async function resolveBase(ctx: Pick<DomainContext, 'db'>, identity: Identity | null, spec: string, project?: string): Promise<BaseRow | undefined> {
  const [name, version] = spec.split('@');
  const recipe = recipeNamed(name);
  const wanted = version ?? (recipe ? recipeVersion(recipe) : undefined);
  let row = wanted ? await basesRepo.get(ctx.db, name, wanted) : await basesRepo.newest(ctx.db, name);
  // Only the nodes make bases under a recipe's name (a row of another origin predates it).
  if (recipe && row && row.origin !== 'builtin') row = undefined;
  row ??= unmadeRecipe(`${name}@${wanted}`);
  if (!row || !visible(identity, row) || (project !== undefined && row.project !== null && row.project !== project)) return undefined;
  return row;
}

