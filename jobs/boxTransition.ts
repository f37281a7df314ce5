import { boxesRepo, BoxRecord, BoxStatus } from '../db/repos/boxes';
import type { WorkerContext } from '../workers/context';
import { defineJob, JobContext } from './types';
import { BoxJobPayload, boxJobPayload } from './boxJobs';

interface Transition {
  kind: string;
  /** Shown while the step runs. */
  during: BoxStatus;
  step(host: WorkerContext, box: BoxRecord): Promise<void>;
  /** Where the box ends; `gone` removes its row (last, so a retry still finds it). */
  after: BoxStatus | 'gone';
  what: string;
}

/** A box job that moves the box through one transitional state: stop, resume, delete. A box
 *  already gone (deleted before this job's turn) makes the job a no-op. */
export const defineBoxTransition = (t: Transition) =>
  defineJob<BoxJobPayload>({
    kind: t.kind,
    payload: boxJobPayload,
    async run({ payload, host }) {
      const box = await boxesRepo.byId(host.db, payload.boxId);
      if (!box) return;
      await boxesRepo.update(host.db, box.id, { status: t.during });
      await t.step(host, box);
      if (t.after === 'gone') await boxesRepo.remove(host.db, box.id);
      else await boxesRepo.update(host.db, box.id, { status: t.after, error: null });
    },
    /** Failed for good: the box is `failed` with why; it can still be deleted. */
    async onFailed({ payload, host }: JobContext<BoxJobPayload>, error: Error) {
      if (await boxesRepo.byId(host.db, payload.boxId)) {
        await boxesRepo.update(host.db, payload.boxId, { status: 'failed', error: `${t.what} failed: ${error.message}` });
      }
    },
  });
