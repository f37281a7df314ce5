import { boxesRepo, BoxRecord } from '../db/repos/boxes';
import { BoxAction, TRANSITIONS } from '../core/box';
import { defineJob, JobContext } from './types';
import { boxJobs, BoxRef } from './boxJobs';
import type { BoxHost } from './ports';

/**
 * A box job that moves the box through one transitional state of the state machine (stop,
 * resume, delete) by one host step. A box already gone (deleted before this job's turn) makes
 * the job a no-op. `gone` removes the row last, so a retry still finds it.
 */
export const defineBoxTransition = (action: Exclude<BoxAction, 'create'>, step: (node: BoxHost, box: BoxRecord) => Promise<void>) => {
  const t = TRANSITIONS[action];
  return defineJob<BoxRef>({
    type: boxJobs[action],
    async run({ payload, db, node }) {
      const box = await boxesRepo.byId(db, payload.boxId);
      if (!box) return;
      await boxesRepo.update(db, box.id, { status: t.during });
      await step(node, box);
      if (t.after === 'gone') await boxesRepo.remove(db, box.id);
      else await boxesRepo.update(db, box.id, { status: t.after, error: null });
    },
    /** Failed for good: the box is `failed` with why; it can still be deleted. */
    async onFailed({ payload, db }: JobContext<BoxRef>, error: Error) {
      if (await boxesRepo.byId(db, payload.boxId)) {
        await boxesRepo.update(db, payload.boxId, { status: 'failed', error: `${action} failed: ${error.message}` });
      }
    },
  });
};
