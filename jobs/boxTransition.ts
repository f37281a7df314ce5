import { boxesRepo, BoxRecord } from '../db/repos/boxes';
import { BoxAction, TRANSITIONS } from '../core/box';
import { defineJob, JobContext, JobRefused } from './types';
import { boxJobs, BoxRef } from './boxJobs';
import type { JobType } from './types';
import type { BoxHost } from './ports';
import { publicReason } from './publicReason';
import { recordBoxEvent } from './boxEvents';
import type { BoxEvent } from '../core/apiTypes';

/** The event a transition records when it is done. */
const DONE_EVENT: Record<Exclude<BoxAction, 'create'>, BoxEvent['kind']> = { stop: 'box.stopped', resume: 'box.resumed', delete: 'box.deleted', restore: 'box.restored' };

/**
 * A box job that moves the box through one transitional state of the state machine (stop,
 * resume, delete) by one host step. A box already gone (deleted before this job's turn) makes
 * the job a no-op. `gone` removes the row last, so a retry still finds it.
 */
export const defineBoxTransition = <P extends BoxRef = BoxRef>(
  action: Exclude<BoxAction, 'create'>,
  step: (node: BoxHost, box: BoxRecord, payload: P) => Promise<void>,
  /** Runs before the box shows its transitional status: throw JobRefused to leave it as it is. */
  precheck?: (node: BoxHost, box: BoxRecord, payload: P) => Promise<void>,
) => {
  const t = TRANSITIONS[action];
  return defineJob<P>({
    type: boxJobs[action] as unknown as JobType<P>,
    async run({ payload, db, node, operationId, rerun }) {
      const box = await boxesRepo.byId(db, payload.boxId);
      if (!box) return;
      // A run of this very operation that died after its step (the host killed between the
      // box's update and the operation's, or the node's reconciliation put the box where its
      // container is): the box is where this was taking it. Its event is recorded (again, at
      // worst: deliveries are at least once).
      if (rerun && box.status === t.after && !t.from.includes(t.after)) {
        await recordBoxEvent(db, box, DONE_EVENT[action], { operationId });
        return;
      }
      // The api allowed this against the state the box was going to be in; when its turn
      // comes, the operations ahead of it may have ended otherwise (a create that failed). Its
      // own transitional status is a retry of this very job.
      if (box.status !== t.during && !t.from.includes(box.status)) {
        throw new JobRefused(`box is ${box.status}${box.error ? ` (${box.error})` : ''}; cannot ${action} it`);
      }
      try {
        if (precheck) await precheck(node, box, payload);
        await boxesRepo.update(db, box.id, { status: t.during });
        await step(node, box, payload);
      } catch (e) {
        // A refusal says where the box is left; its transitional status must not stay behind.
        if (e instanceof JobRefused && e.leaveStatus) await boxesRepo.update(db, box.id, { status: e.leaveStatus });
        throw e;
      }
      if (t.after === 'gone') await boxesRepo.remove(db, box.id);
      else await boxesRepo.update(db, box.id, { status: t.after, error: null });
      await recordBoxEvent(db, box, DONE_EVENT[action], { operationId });
    },
    /** Failed for good: the box is `failed` with why; it can still be deleted. A refused job
     *  never touched the box, which keeps its status and error. */
    async onFailed({ payload, db, operationId }: JobContext<P>, error: Error) {
      if (error instanceof JobRefused) return;
      const box = await boxesRepo.byId(db, payload.boxId);
      if (box) {
        // Public words only: project tokens read this (the worker logged the full error).
        const why = `${action} failed: ${publicReason(error)}`;
        await boxesRepo.update(db, payload.boxId, { status: 'failed', error: why });
        await recordBoxEvent(db, box, 'box.failed', { operationId, error: why });
      }
    },
  });
};
