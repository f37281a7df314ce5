import { boxesRepo } from '../db/repos/boxes';
import { TRANSITIONS } from '../core/box';
import { defineJob } from './types';
import { boxJobs } from './boxJobs';
import { publicReason } from './publicReason';

/** creating → running: clone the root, join the network, start the container. */
export const createBoxJob = defineJob({
  type: boxJobs.create,
  async run({ payload, db, node, progress }) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return; // deleted before its turn came
    await node.createRoot(box, payload.source);
    await progress(50);
    await node.start(box);
    await boxesRepo.update(db, box.id, { status: TRANSITIONS.create.after as 'running', error: null });
  },
  /** Never a half-made box: what was made is removed, the row stays `failed` with the reason. */
  async onFailed({ payload, db, node, log }, error) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return;
    await node.destroy(box).catch((e) => log.warn({ err: (e as Error).message }, 'cleanup of a failed create'));
    // Project tokens read the box's error: what failed in plain words (the worker logged it all).
    await boxesRepo.update(db, box.id, { status: 'failed', error: `create failed: ${publicReason(error)}`, address: null });
  },
});
