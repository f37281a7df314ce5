import { boxesRepo } from '../db/repos/boxes';
import { defineJob } from './types';
import { BOX_JOB, BoxJobPayload, boxJobPayload } from './boxJobs';
import { startBox } from '../workers/boxMachine';
import { markFailed } from './boxFailure';

/** stopped → resuming → running, with the config as it is now (PUT while stopped applies). */
export const resumeBoxJob = defineJob<BoxJobPayload>({
  kind: BOX_JOB.resume,
  payload: boxJobPayload,
  async run({ payload, host }) {
    const box = await boxesRepo.byId(host.db, payload.boxId);
    if (!box) return;
    await boxesRepo.update(host.db, box.id, { status: 'resuming' });
    await startBox(host, box);
    await boxesRepo.update(host.db, box.id, { status: 'running', error: null });
  },
  onFailed: markFailed('resume'),
});
