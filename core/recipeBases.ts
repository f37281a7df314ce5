import crypto from 'node:crypto';

/**
 * Built-in bases a node makes from a recipe on first use (docs/bases.md "The debian base"), as
 * opposed to `busybox`, which every node makes at start. The version is the recipe's hash: the
 * same recipe is the same version on every node, and a changed recipe is a new version (older
 * ones stay where they were made, for the boxes made from them).
 */
export interface BaseRecipe {
  name: string;
  /** mmdebstrap's suite and variant. */
  suite: string;
  variant: 'minbase';
  /** Packages on top of the variant's. */
  include: string[];
  /** The ordinary user made in the base: `useradd -m -U -u <uid> -s /bin/bash <name>`. */
  user: { name: string; uid: number };
  /** Bumped when the way it is made changes (hooks, post-processing). */
  revision: number;
  /** When this revision was written: the `created_at` the base shows until a node has made it
   *  (the same on every read and every api process). Not part of the version. */
  published: string;
}

export const DEBIAN_RECIPE: BaseRecipe = {
  name: 'debian',
  suite: 'bookworm',
  variant: 'minbase',
  include: ['ca-certificates', 'procps', 'curl', 'less'],
  user: { name: 'box', uid: 1000 },
  revision: 1,
  published: '2026-11-24T09:33:13.000Z',
};

export const RECIPES: readonly BaseRecipe[] = [DEBIAN_RECIPE];

/** The version every node gives a recipe: first 12 hex of sha256 of its canonical JSON. */
export const recipeVersion = (r: BaseRecipe): string =>
  crypto.createHash('sha256').update(JSON.stringify([r.name, r.suite, r.variant, [...r.include].sort(), r.user.name, r.user.uid, r.revision])).digest('hex').slice(0, 12);

export const recipeNamed = (name: string): BaseRecipe | undefined => RECIPES.find((r) => r.name === name);

/** The recipe that makes exactly `name@version` (only its current version can be made). */
export const recipeOf = (ref: { name: string; version: string }): BaseRecipe | undefined => {
  const r = recipeNamed(ref.name);
  return r && recipeVersion(r) === ref.version ? r : undefined;
};
