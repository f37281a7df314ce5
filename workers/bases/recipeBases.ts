import path from 'node:path';
import type { BaseRef } from '../../core/box';
import type { Logger } from '../../core/logger';
import { recipeOf, recipeNamed, recipeVersion } from '../../core/recipeBases';
import { basesRepo } from '../../db/repos/bases';
import type { Db } from '../../db/knex';
import type { StorageDriver } from '../drivers';
import { readAptSources, sourcesForSuite, type AptSource } from './aptSources';
import { fillDebianRootfs, RecipeError } from './debianRootfs';

export interface RecipeBasesDeps {
  db: Db;
  storage: StorageDriver;
  log: Logger;
  /** `<data dir>/recipes`: one work directory per version being made. */
  workRoot: string;
  timeoutMs: number;
  limits: { maxUnpackedBytes: number };
  /** Where the node's package sources are read (BOXHOST_DEBIAN_SOURCES, else apt's own). */
  sourcePlaces?: string[];
  /** Test seam: what fills a recipe base's dataset (default: mmdebstrap). */
  fill?: (dir: string, ref: BaseRef) => Promise<void>;
}

/**
 * The node's recipe bases (core/recipeBases.ts): made on this node the first time a box needs
 * one or `POST /v1/bases/{name}/build` asks, once; their record is then written as a built-in
 * base's (every node has its own copy). Two callers at once in this process share one making;
 * a half-made one (a worker killed meanwhile) is destroyed and made again by the storage driver.
 */
export class RecipeBases {
  private readonly making = new Map<string, Promise<boolean>>();
  private readonly known = new Set<string>();
  /** A making that failed, for FAILURE_HOLD_MS: the creates queued behind it fail with its
   *  reason instead of each running mmdebstrap again for minutes. */
  private readonly failed = new Map<string, { at: number; error: unknown }>();
  static readonly FAILURE_HOLD_MS = 60_000;
  constructor(private readonly d: RecipeBasesDeps) {}

  /** Whether `ref` is a recipe base (of any version) — only those are made here. */
  static isRecipe = (ref: BaseRef) => recipeNamed(ref.name) !== undefined;

  /** The node's package sources a recipe is made from. */
  sources(suite: string): AptSource[] {
    return sourcesForSuite(readAptSources(this.d.sourcePlaces), suite);
  }

  /**
   * Makes `ref` on this node unless it is there; answers true when it was made now (false: it
   * was there). A version other than the recipe's current one cannot be made.
   */
  async ensure(ref: BaseRef): Promise<boolean> {
    const key = `${ref.name}@${ref.version}`;
    if (this.known.has(key)) return false;
    let p = this.making.get(key);
    if (!p) {
      const failed = this.failed.get(key);
      if (failed && Date.now() - failed.at < RecipeBases.FAILURE_HOLD_MS) throw failed.error;
      p = this.make(ref)
        .catch((error: unknown) => {
          this.failed.set(key, { at: Date.now(), error });
          throw error;
        })
        .finally(() => this.making.delete(key));
      this.making.set(key, p);
    }
    const made = await p;
    this.known.add(key);
    this.failed.delete(key);
    return made;
  }

  private async make(ref: BaseRef): Promise<boolean> {
    let made = false;
    if (!(await this.d.storage.hasBase(ref))) {
      const recipe = recipeOf(ref);
      if (!recipe) {
        const current = recipeNamed(ref.name);
        throw new RecipeError(`base ${ref.name}@${ref.version} is not on this node, and only ${ref.name}@${current ? recipeVersion(current) : '?'} can be made here`);
      }
      this.d.log.info(ref, 'making a recipe base');
      const fill = this.d.fill ?? ((dir: string) => fillDebianRootfs(dir, recipe, {
        sources: this.sources(recipe.suite),
        workDir: path.join(this.d.workRoot, `${ref.name}-${ref.version}`),
        timeoutMs: this.d.timeoutMs,
        limits: this.d.limits,
        log: this.d.log,
      }));
      await this.d.storage.createBase(ref, (dir) => fill(dir, ref));
      made = true;
    }
    await basesRepo.ensure(this.d.db, { ...ref, size_bytes: await this.d.storage.baseSizeBytes(ref) });
    return made;
  }
}
