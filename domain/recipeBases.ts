import type { DomainContext, Identity } from './context';
import type { Base } from '../core/apiTypes';
import { notFound } from '../core/errors';
import { RECIPES, recipeNamed, recipeVersion, type BaseRecipe } from '../core/recipeBases';
import { basesRepo, NO_META, type BaseRow } from '../db/repos/bases';
import { baseJobs } from '../jobs/baseJobs';
import type { Accepted } from './operations';

/**
 * Recipe bases (`debian`, core/recipeBases.ts; docs/bases.md "The debian base"): built-in bases
 * a node makes from a recipe the first time a box needs one there, or when
 * `POST /v1/bases/{name}/build` asks. Until some node has made one, the base is shown as its
 * recipe's version with no size yet, so it can be listed, got and named in a box create.
 */

/** The record a recipe's current version has before any node made it. */
export const unmadeRecipeRow = (r: BaseRecipe): BaseRow => ({
  ...NO_META,
  name: r.name,
  version: recipeVersion(r),
  size_bytes: 0,
  created_at: r.published,
  state: 'ready',
  origin: 'builtin',
  project: null,
  node: null,
  sha256: null,
  created_by: null,
});

/** `name` or `name@<its recipe version>` of a recipe no node has made yet. */
export function unmadeRecipe(spec: string): BaseRow | undefined {
  const [name, version] = spec.split('@');
  const r = recipeNamed(name);
  if (!r || (version !== undefined && version !== recipeVersion(r))) return undefined;
  return unmadeRecipeRow(r);
}

/** The recipes' current versions no node has made yet (listed beside the made bases). */
export const unmadeRecipes = (made: BaseRow[]): BaseRow[] =>
  RECIPES.filter((r) => !made.some((m) => m.name === r.name && m.version === recipeVersion(r))).map(unmadeRecipeRow);

export interface RecipeBuildRequest {
  /** The node to make it on (default: where the next box would go). */
  node?: string;
}

/**
 * Makes a recipe base on a node ahead of the first box (202 + operation `base.recipe`); on a
 * node that has it already the operation only records it. An unknown recipe → 404.
 */
export async function buildRecipeBase(ctx: DomainContext, identity: Identity, name: string, req: RecipeBuildRequest, load: (row: BaseRow) => Base): Promise<Accepted<Base>> {
  const recipe = recipeNamed(name);
  if (!recipe) throw notFound(`recipe base ${name} (the bases a node makes itself: ${RECIPES.map((r) => r.name).join(', ')}; build your own with POST /v1/base-builds)`);
  const version = recipeVersion(recipe);
  const nodeId = req.node ?? (await ctx.nodes.place(ctx.config.region, { cpus: 0, ram_mb: 0, storage_gb: 0 }));
  if (req.node) await ctx.nodes.get(nodeId);
  await ctx.nodes.assertUp(nodeId);
  const operation = await ctx.db.transaction((trx) =>
    ctx.queue.enqueue(trx, baseJobs.recipe.of({ name, version }), {
      resource: `/v1/bases/${name}@${version}`, node: nodeId, project: identity.projects?.[0], createdBy: identity.name,
    }),
  );
  return {
    operation,
    // Once its operation failed, nothing was made to show: null, and the reply is the error.
    load: async () => {
      const row = await basesRepo.getAny(ctx.db, name, version);
      if (row) return load(row);
      return (await ctx.queue.waitFor(operation.id, 0))?.status === 'failed' ? null : load(unmadeRecipeRow(recipe));
    },
  };
}
