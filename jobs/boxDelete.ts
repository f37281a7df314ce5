import { boxesRepo } from '../db/repos/boxes';
import { defineJob } from './types';
import { BOX_JOB, BoxJobPayload, boxJobPayload } from './boxJobs';
import { destroyBox } from '../workers/boxMachine';
import { markFailed } from './boxFailure';

/** deleting → gone: container, network, datasets, then the row (last, so a retry finds it). */
export const deleteBoxJob = defineJob<BoxJobPayload>({
  kind: BOX_JOB.delete,
  payload: boxJobPayload,
  async run({ payload, host }) {
    const box = await boxesRepo.byId(host.db, payload.boxId);
    if (!box) return;
    await boxesRepo.update(host.db, box.id, { status: 'deleting' });
    await destroyBox(host, box);
    await boxesRepo.remove(host.db, box.id);
  },
  onFailed: markFailed('delete'),
});
