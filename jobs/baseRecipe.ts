import { baseJobs } from './baseJobs';
import { defineJob } from './types';

/**
 * A recipe base (`debian`) made on the job's node ahead of its first box
 * (`POST /v1/bases/{name}/build`); a node that has it only records it. Idempotent: a retry after
 * a worker died midway finds the half-made base and the storage driver makes it again. Nothing
 * to undo when it fails for good: a half-made base is destroyed by the attempt that failed.
 */
export const recipeBaseJob = defineJob({
  type: baseJobs.recipe,
  async run({ payload, bases, log }) {
    const made = await bases.makeRecipe(payload);
    log.info({ base: `${payload.name}@${payload.version}`, made }, made ? 'recipe base made' : 'recipe base was there');
  },
});
