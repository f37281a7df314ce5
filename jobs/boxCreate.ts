import { boxesRepo } from '../db/repos/boxes';
import { basesRepo } from '../db/repos/bases';
import { baseBuildsRepo } from '../db/repos/baseBuilds';
import { defineJob, JobNotYet, JobRefused } from './types';
import { boxJobs } from './boxJobs';
import { publicReason } from './publicReason';
import { recordBoxEvent } from './boxEvents';

/** creating → running: clone the root, join the network, start the container. */
export const createBoxJob = defineJob({
  type: boxJobs.create,
  firstOfBox: true,
  async run({ payload, db, node, progress, operationId, operation }) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return; // deleted before its turn came
    // Marked running by a run that died before its job was recorded done (the host may have
    // restarted since): the container is made sure of, as a start does.
    if (box.status === 'running') return void (await node.start(box));
    // Deleting, stopped, failed: a late run of this job (a retry, or a run BullMQ took for
    // stalled on a loaded host) must never make the root again under a delete.
    if (box.status !== 'creating') return;
    if (payload.source.kind === 'base') await baseReady(db, payload.source.base);
    // The address goes on the row with `running` (a retry after a crash between the two takes
    // the same lease again). A delete that came while the root was made: nothing is started.
    // Read before the progress is written (the embedded db takes them in turn), which goes on
    // beside the start and is done before the end is.
    let halfway: Promise<void> = Promise.resolve();
    let address: string | null;
    try {
      address = await node.create(box, payload.source, async () => {
        const now = boxesRepo.byId(db, box.id);
        halfway = progress(50);
        halfway.catch(() => undefined); // awaited below
        return (await now)?.status === 'creating';
      });
    } finally {
      // Nothing of this run goes on behind its end; a failed progress write does not hide the
      // create's own failure, and fails the run (as before) when the create did not fail.
      await halfway.catch(() => undefined);
    }
    await halfway;
    if (address === null) return;
    if (await boxesRepo.markCreated(db, box.id, address)) await recordBoxEvent(db, box, 'box.created', { operationId, operation });
  },
  /** Never a half-made box: what was made is removed, the row stays `failed` with the reason. */
  async onFailed({ payload, db, node, log, operationId }, error) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return;
    await node.destroy(box).catch((e) => log.warn({ err: (e as Error).message }, 'cleanup of a failed create'));
    // Project tokens read the box's error: what failed in plain words (the worker logged it all).
    const why = `create failed: ${publicReason(error)}`;
    await boxesRepo.update(db, box.id, { status: 'failed', error: why, address: null });
    await recordBoxEvent(db, box, 'box.failed', { operationId, error: why });
  },
});

/**
 * A base still being built (a pack instance made while its pack's base builds, docs/packs.md):
 * the create waits for it; a build that failed took the version's row with it, and the create
 * is refused naming the build. Otherwise a base with no row is a node's own (built-in, or a
 * recipe made on first use).
 */
async function baseReady(db: Parameters<typeof basesRepo.getAny>[0], base: { name: string; version: string }): Promise<void> {
  const row = await basesRepo.getAny(db, base.name, base.version);
  if (row?.state === 'making') throw new JobNotYet(`base ${base.name}@${base.version} is being built`, 2000);
  if (row) return;
  const build = await baseBuildsRepo.latest(db, base.name, base.version);
  // A failing build drops the version's row before it is marked failed: still its word to wait for.
  if (build?.status === 'queued' || build?.status === 'running') throw new JobNotYet(`base ${base.name}@${base.version} is being built`, 2000);
  if (build?.status === 'failed') throw new JobRefused(`base ${base.name}@${base.version} was not built: its build ${build.id} failed${build.exit_code !== null ? ` (its script exited ${build.exit_code})` : ''}`);
}
