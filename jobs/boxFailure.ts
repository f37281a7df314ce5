import { boxesRepo } from '../db/repos/boxes';
import type { JobContext } from './types';
import type { BoxJobPayload } from './boxJobs';

/** A box operation that failed for good leaves the box `failed` with why; it can still be deleted. */
export const markFailed = (what: string) => async ({ payload, host }: JobContext<BoxJobPayload>, error: Error) => {
  if (await boxesRepo.byId(host.db, payload.boxId)) {
    await boxesRepo.update(host.db, payload.boxId, { status: 'failed', error: `${what} failed: ${error.message}` });
  }
};
