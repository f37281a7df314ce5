import Joi from 'joi';
import type { Db } from '../db/knex';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { deploysRepo } from '../db/repos/deploys';
import { operationsRepo, isFinished } from '../db/repos/operations';
import type { PublishRow } from '../db/repos/publishes';
import { now } from '../core/ids';
import { defineJob, jobType, JobNotYet, JobRefused, type JobContext } from './types';
import { assertCreated, startPackServices } from './packServices';
import { recordBoxEvent } from './boxEvents';
import { stopBoxJob } from './boxStop';
import { deleteBoxJob } from './boxDelete';

/**
 * Deploy generations (docs/packs.md "Deploy generations"): `pack.deploy` brings a generation up
 * (its services through their ready gates) and then moves the line's publishes onto it in one
 * transaction; `pack.retire` stops or deletes another box of the line once that deploy has ended
 * the way it waits for. The domain (domain/deploys.ts) queues them together, in one transaction.
 */

/** A publish the generation takes, planned by the domain (hosts are the line's). */
export type PlannedPublish = Pick<PublishRow, 'host' | 'name' | 'port' | 'public' | 'service' | 'warning'>;

export interface DeployPayload {
  boxId: string;
  project: string;
  line: string;
  /** The service publishes of the generation's revision, under the line's host names. */
  publishes: PlannedPublish[];
  /** A rollback keeps the box's own rollback_to (a deploy sets it to the generation it replaces). */
  rollback: boolean;
}

export interface RetirePayload {
  boxId: string;
  /** The deploy (or rollback) operation this waits for. */
  deployOp: string;
  /** `switched`: act once that deploy moved the line off this box; `failed`: once it failed. */
  when: 'switched' | 'failed';
  action: 'stop' | 'delete';
  /** How long the box keeps serving after the switch (requests the proxies sent it finish). */
  drainMs: number;
}

const boxId = Joi.string().pattern(/^[a-z0-9]{1,32}$/).required();

export const deployJobs = {
  deploy: jobType<DeployPayload>('pack.deploy', Joi.object<DeployPayload>({
    boxId,
    project: Joi.string().required(),
    line: Joi.string().required(),
    publishes: Joi.array().items(Joi.object({
      host: Joi.string().required(), name: Joi.string().required(), port: Joi.number().integer().required(),
      public: Joi.boolean().required(), service: Joi.string().allow(null).required(), warning: Joi.string().allow(null).required(),
    })).required(),
    rollback: Joi.boolean().required(),
  })),
  retire: jobType<RetirePayload>('pack.retire', Joi.object<RetirePayload>({
    boxId,
    deployOp: Joi.string().required(),
    when: Joi.string().valid('switched', 'failed').required(),
    action: Joi.string().valid('stop', 'delete').required(),
    drainMs: Joi.number().integer().min(0).required(),
  })),
};

/**
 * Starts the generation's services (the revision it pinned) through their ready gates, then, in
 * one transaction: the line's publishes named by the revision are replaced by the planned rows
 * (same hosts, this box), the line's other publishes (added by hand) move to this box, and the
 * line names this box live. A retry after the switch finds the line already on this box.
 */
export const packDeployJob = defineJob({
  type: deployJobs.deploy,
  async run({ payload, db, node, progress, operationId }) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) throw new JobRefused('the generation was deleted before its deploy');
    const line = await deploysRepo.line(db, payload.project, payload.line);
    if (!line) throw new JobRefused(`line ${payload.line} is gone (its live box was deleted)`);
    if (line.switched_by === operationId) return; // switched by an earlier run of this job
    if (line.deploy_op !== operationId) throw new JobRefused(`line ${payload.line} is being deployed by another operation`);
    await assertCreated(db, box, 'it was not deployed');
    // A published service without a ready gate gets one on its port: the line is switched only
    // to a generation that answers there.
    await startPackServices(db, node, box, (p) => progress(Math.min(p, 95)), { gatePublished: true });
    await db.transaction((trx) => switchLine(trx, box, payload, operationId));
  },
  async onFailed({ payload, db, operationId }: JobContext<DeployPayload>) {
    // The line stays on the generation it had, and can be deployed again.
    await db('deploy_lines').where({ project: payload.project, line: payload.line, deploy_op: operationId }).update({ deploy_op: null, updated_at: now() });
  },
});

/**
 * The switch, in the caller's transaction. The old generation's service publishes (of its own
 * revision) go; its publishes under the line's hosts made by hand move with the line; the new
 * generation's revision's publishes take the line's hosts; the line records who switched it,
 * and the `box.deployed` event is written with it.
 */
async function switchLine(trx: Db, box: BoxRecord, p: DeployPayload, operationId: string): Promise<void> {
  const line = await deploysRepo.lockLine(trx, p.project, p.line);
  if (!line) throw new JobRefused(`line ${p.line} is gone (its live box was deleted)`);
  if (line.switched_by === operationId) return;
  if (line.deploy_op !== operationId) throw new JobRefused(`line ${p.line} changed while it was deployed`);
  const from = line.live_box_id;
  const at = now();
  if (from !== p.boxId) {
    await trx('publishes').where({ box_id: from }).whereNotNull('service').delete();
    await trx('publishes').where({ box_id: from }).whereIn('name', p.publishes.map((x) => x.name)).delete();
    // Hand-made publishes under the line's hosts move; one under the old generation's own name
    // (`<name>--<line>-gN--<project>`) stays with that box.
    const own = (await trx('publishes').where({ box_id: p.boxId }).select('name')).map((r: { name: string }) => r.name);
    await trx('publishes').where({ box_id: from }).whereNull('service').whereNotIn('name', own)
      .where('host', 'like', `%--${p.line}--${p.project}.%`).update({ box_id: p.boxId, updated_at: at });
  }
  await trx('publishes').whereIn('host', p.publishes.map((x) => x.host)).delete();
  if (p.publishes.length > 0) await trx('publishes').insert(p.publishes.map((x) => ({ ...x, box_id: p.boxId, project: p.project, created_at: at, updated_at: at })));
  await deploysRepo.updateLine(trx, p.project, p.line, { live_box_id: p.boxId, deploy_op: null, switched_at: at, switched_by: operationId });
  if (!p.rollback && from !== p.boxId) {
    const old = await boxesRepo.byId(trx, from);
    await boxesRepo.update(trx, p.boxId, { rollback_to: old?.name ?? null });
  }
  await recordBoxEvent(trx, box, 'box.deployed', { operationId });
}

/**
 * Waits for the deploy it names to end. `switched`: when it moved the line off this box, the box
 * keeps running `drainMs` more, then is stopped (the generation kept for a rollback) or deleted
 * (one the line no longer needs). `failed`: when it failed, the generation it tried is stopped
 * (kept for its logs until the next deploy). Otherwise nothing is done.
 */
export const packRetireJob = defineJob({
  type: deployJobs.retire,
  async run(ctx) {
    const { payload, db } = ctx;
    const op = await operationsRepo.get(db, payload.deployOp);
    if (op && !isFinished(op.status)) throw new JobNotYet(`waiting for deploy ${payload.deployOp}`);
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return;
    const gen = await deploysRepo.generationOf(db, box.id);
    const line = gen ? await deploysRepo.line(db, gen.project, gen.line) : undefined;
    if (!line || line.live_box_id === box.id) return;
    // A deploy or rollback to this very box is under way (a rollback asked during the drain):
    // it is the line's next live box, not one to retire.
    if (line.deploy_op) {
      const next = await operationsRepo.get(db, line.deploy_op);
      if (next?.box_id === box.id && !isFinished(next.status)) return;
    }
    // Whether the deploy switched the line: it succeeded, or the line says so (its operation may
    // say failed after the switch committed: a run lost by its worker, reconciliation).
    const switched = op?.status === 'succeeded' || line.switched_by === payload.deployOp;
    if (payload.when === 'failed') {
      if (switched) return;
    } else {
      if (!switched) return;
      const left = Date.parse(line.switched_at ?? new Date(0).toISOString()) + payload.drainMs - Date.now();
      if (left > 0) throw new JobNotYet('draining the requests it was sent', Math.min(left + 50, 60_000));
    }
    if (payload.action === 'delete') {
      await boxesRepo.update(db, box.id, { status: 'deleting', error: null });
      return deleteBoxJob.run({ ...ctx, payload: { boxId: box.id } });
    }
    if (box.status !== 'running' && box.status !== 'stopping') return;
    // The line looked at again and the box marked `stopping` in one transaction under the line's
    // lock, which a rollback takes too: a rollback to this box either committed first (it is the
    // line's next live box: left running) or sees it `stopping` and resumes it behind this stop.
    // (Looked at apart, a rollback that committed between the look and the stop was answered
    // with its box stopped: seen in CI on a slow VM.)
    const claimed = await db.transaction(async (trx) => {
      const locked = await deploysRepo.lockLine(trx, gen!.project, gen!.line);
      if (!locked || locked.live_box_id === box.id) return false;
      if (locked.deploy_op) {
        const next = await operationsRepo.get(trx, locked.deploy_op);
        if (next?.box_id === box.id && !isFinished(next.status)) return false;
      }
      const now = await boxesRepo.byId(trx, box.id, { lock: true });
      if (now?.status !== 'running' && now?.status !== 'stopping') return false;
      if (now.status === 'running') await boxesRepo.update(trx, box.id, { status: 'stopping' });
      return true;
    });
    if (claimed) return stopBoxJob.run({ ...ctx, payload: { boxId: box.id } });
  },
  /** A stop or delete that failed for good leaves the box failed with why, as those jobs do. */
  async onFailed(ctx: JobContext<RetirePayload>, error: Error) {
    const job = ctx.payload.action === 'delete' ? deleteBoxJob : stopBoxJob;
    await job.onFailed?.({ ...ctx, payload: { boxId: ctx.payload.boxId } }, error);
  },
});
