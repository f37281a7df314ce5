import { volumesRepo } from '../db/repos/volumes';
import { operationsRepo } from '../db/repos/operations';
import { volumeTurnKey } from '../jobs/dataJobs';
import type { WorkerContext } from './context';

/**
 * Lets go of the datasets of volumes that moved to another node (docs/data.md "Moving a volume
 * to another node"): for each eviction row naming this node, the dataset is destroyed unless the
 * volume is this node's again (a move back: the row is just forgotten) or has an operation under
 * way (a move back in flight: looked at again next time). The backup directory is never touched:
 * the volume's backups are its, wherever it is. Answers the volumes whose dataset went.
 */
export async function sweepEvictions(ctx: Pick<WorkerContext, 'db' | 'volumes' | 'config'> & { log?: WorkerContext['log'] }): Promise<string[]> {
  const me = ctx.config.nodeId;
  const gone: string[] = [];
  for (const e of await volumesRepo.evictionsOf(ctx.db, me)) {
    // One that fails (a dataset busy for now) is tried again next time; the others go on.
    try {
      let ours = false;
      const destroyed = await ctx.volumes.destroyVolumeIf(e.volume_id, async () => {
        const vol = await volumesRepo.byId(ctx.db, e.volume_id);
        ours = vol?.node === me;
        if (ours) return false;
        return (await operationsRepo.unfinishedForBox(ctx.db, volumeTurnKey(e.volume_id))).length === 0;
      });
      if (destroyed) gone.push(e.volume_id);
      if (destroyed || ours) await volumesRepo.forgetEviction(ctx.db, e.volume_id, me);
    } catch (err) {
      ctx.log?.warn({ volumeId: e.volume_id, err: (err as Error).message }, 'could not let go of a moved volume\'s dataset yet');
    }
  }
  return gone;
}
