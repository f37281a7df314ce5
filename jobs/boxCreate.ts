import { boxesRepo } from '../db/repos/boxes';
import { defineJob } from './types';
import { BOX_JOB, BoxJobPayload, boxJobPayload } from './boxJobs';
import { destroyBox, startBox } from '../workers/boxMachine';

/** creating → running: clone the root, join the network, start the container. */
export const createBoxJob = defineJob<BoxJobPayload>({
  kind: BOX_JOB.create,
  payload: boxJobPayload,
  async run({ payload, host, progress }) {
    const box = await boxesRepo.byId(host.db, payload.boxId);
    if (!box) return; // deleted before its turn came
    if (!payload.source) throw new Error('create without a root source');
    // The root and the netns do not depend on each other: make them side by side.
    await Promise.all([host.storage.createBoxRoot(box.id, payload.source, box.config.storage_gb), host.network.prepare(box.id)]);
    await progress(50);
    await startBox(host, box);
    await boxesRepo.update(host.db, box.id, { status: 'running', error: null });
  },
  /** Never a half-made box: what was made is removed, the row stays `failed` with the reason. */
  async onFailed({ payload, host, log }, error) {
    const box = await boxesRepo.byId(host.db, payload.boxId);
    if (!box) return;
    await destroyBox(host, box).catch((e) => log.warn({ err: (e as Error).message }, 'cleanup of a failed create'));
    await boxesRepo.update(host.db, box.id, { status: 'failed', error: `create failed: ${error.message}`, address: null });
  },
});
