import { boxesRepo } from '../db/repos/boxes';
import { defineJob } from './types';
import { BOX_JOB, BoxJobPayload, boxJobPayload } from './boxJobs';
import { stopBox } from '../workers/boxMachine';
import { markFailed } from './boxFailure';

/** running → stopping → stopped: SIGTERM, SIGKILL after the grace period; the root is kept. */
export const stopBoxJob = defineJob<BoxJobPayload>({
  kind: BOX_JOB.stop,
  payload: boxJobPayload,
  async run({ payload, host }) {
    const box = await boxesRepo.byId(host.db, payload.boxId);
    if (!box) return;
    await boxesRepo.update(host.db, box.id, { status: 'stopping' });
    await stopBox(host, box);
    await boxesRepo.update(host.db, box.id, { status: 'stopped', error: null });
  },
  onFailed: markFailed('stop'),
});
