import { ConnectionOptions, DelayedError, Job, UnrecoverableError, Worker } from 'bullmq';
import IORedis, { RedisOptions } from 'ioredis';
import { isFinished, OperationRow, operationsRepo } from '../db/repos/operations';
import { DEFAULT_ATTEMPTS, nodeQueueName, operationsChannel, announceLocally } from '../jobs/queue';
import { JobNotYet, type JobContext, type JobEnvelope, type JobHandler } from '../jobs/types';
import { BaseSteps, stagingDirOf } from './baseSteps';
import { VolumeSteps } from './volumeSteps';
import { publicReason } from '../jobs/publicReason';
import type { WorkerContext } from './context';

export interface WorkerOptions {
  connection: RedisOptions;
  prefix: string;
  concurrency: number;
  /** How long a job's lock lives without renewal; a dead worker's job is retaken after it. */
  lockDurationMs?: number;
  stalledIntervalMs?: number;
}

/** How long a job waits before looking again whether an earlier operation on its box is done. */
const TURN_POLL_MS = 200;
const UNCOMMITTED_POLL_MS = 20;
const UNCOMMITTED_GIVE_UP_MS = 60_000;

/**
 * The BullMQ worker: looks up the job's kind, keeps its operation row in step (queued →
 * running → succeeded | failed), and runs operations on one box in arrival order.
 */
export function startWorker(ctx: WorkerContext, handlers: JobHandler[], opts: WorkerOptions): Worker {
  const registry = new Map(handlers.map((h) => [h.type.kind, h]));
  // Waiters in api processes wake when an operation's end is announced here.
  const publisher = new IORedis({ ...opts.connection, maxRetriesPerRequest: 1 });
  publisher.on('error', () => undefined);
  const finish = async (id: string, patch: Partial<Pick<OperationRow, 'status' | 'progress' | 'error'>>) => {
    await operationsRepo.update(ctx.db, id, patch);
    announceLocally(id);
    await publisher.publish(operationsChannel(opts.prefix), id).catch(() => undefined);
  };

  const bases = new BaseSteps({ storage: ctx.storage, runtime: ctx.runtime, stagingDir: stagingDirOf(ctx.config), limits: ctx.config.baseImport, buildTimeoutMs: ctx.config.buildTimeoutSecs * 1000, recipes: ctx.recipes, sourcesProxy: ctx.sourcesProxy, network: ctx.network });
  const volumes = new VolumeSteps({ volumes: ctx.volumes, backupDir: ctx.config.backupDir, nodeId: ctx.config.nodeId });

  /** The context a handler runs with, for the attempt that is starting now. */
  const jobContext = (job: Job<JobEnvelope>, payload: unknown, rerun: boolean, operation?: JobContext<unknown>['operation']): JobContext<any> => {
    const { operationId } = job.data;
    const attempt = job.attemptsMade + 1;
    return {
      payload,
      operationId,
      attempt,
      rerun,
      lastAttempt: attempt >= (job.opts.attempts ?? DEFAULT_ATTEMPTS),
      db: ctx.db,
      node: ctx.boxes,
      bases,
      volumes,
      log: ctx.log.child({ op: operationId, kind: job.name, attempt }),
      progress: async (percent: number) => {
        await operationsRepo.update(ctx.db, operationId, { progress: Math.round(percent) });
      },
      operation: operation && { created_by: operation.created_by, created_at: operation.created_at },
    };
  };

  const processor = async (job: Job<JobEnvelope>, token?: string) => {
    const kind = registry.get(job.name);
    if (!kind) throw new UnrecoverableError(`unknown job kind ${job.name}`);
    const { operationId } = job.data;
    const op = await operationsRepo.get(ctx.db, operationId);
    // The api adds the job just before its transaction commits, so a fast worker can get here
    // first: look again shortly, without spending an attempt. A row that never shows up means
    // the transaction rolled back; the job is dropped.
    if (!op) {
      if (Date.now() - job.timestamp > UNCOMMITTED_GIVE_UP_MS) throw new UnrecoverableError(`operation ${operationId} was never recorded`);
      await job.moveToDelayed(Date.now() + UNCOMMITTED_POLL_MS, token);
      throw new DelayedError();
    }
    if (isFinished(op.status)) return;

    if (op.box_id && !kind.firstOfBox && (await operationsRepo.earlierUnfinished(ctx.db, op.box_id, op.seq))) {
      await job.moveToDelayed(Date.now() + TURN_POLL_MS, token);
      throw new DelayedError();
    }

    const { value: payload, error } = kind.type.schema.validate(job.data.payload);
    const jctx = jobContext(job, payload, op.status === 'running', op);
    const log = jctx.log;
    try {
      if (error) throw new UnrecoverableError(`bad payload: ${error.message}`);
      await operationsRepo.update(ctx.db, operationId, { status: 'running' });
      log.info('operation running');
      await kind.run(jctx);
      // When the work ended, taken before the row says so: the box's next operation may start
      // (on another worker) between that commit and this log line.
      const workEndedAt = Date.now();
      await finish(operationId, { status: 'succeeded', progress: 100, error: null });
      log.info({ work_ended_at: workEndedAt }, 'operation succeeded');
    } catch (e) {
      const err = e as Error;
      if (err instanceof JobNotYet) {
        await operationsRepo.update(ctx.db, operationId, { status: 'queued', error: `waiting: ${err.message}` });
        await job.moveToDelayed(Date.now() + err.retryInMs, token);
        throw new DelayedError();
      }
      const final = err instanceof UnrecoverableError || jctx.lastAttempt;
      // The full error (command line, paths, stderr) stays in the node's log under the
      // operation id; the row, which project tokens read, gets the public reason only.
      log.warn({ err, final }, 'operation step failed');
      if (final) {
        try {
          await kind.onFailed?.(jctx, err);
        } finally {
          await finish(operationId, { status: 'failed', error: publicReason(err) });
        }
      } else {
        await operationsRepo.update(ctx.db, operationId, { error: `retrying: ${publicReason(err)}` });
      }
      throw err;
    }
  };

  const worker = new Worker(nodeQueueName(ctx.config.nodeId), processor, {
    connection: opts.connection as ConnectionOptions,
    prefix: opts.prefix,
    concurrency: opts.concurrency,
    lockDuration: opts.lockDurationMs ?? 15000,
    stalledInterval: opts.stalledIntervalMs ?? 10000,
    maxStalledCount: 3,
    autorun: true,
    // Recorded on each job as `processedBy`: which process of which node ran it.
    name: `${ctx.config.nodeId}:${process.pid}`,
  });
  worker.on('error', (err) => ctx.log.warn({ err: err.message }, 'worker connection error'));
  // BullMQ can fail a job without running it again (it stalled more often than allowed); the
  // processor never hears of that, so the operation and its resource are failed here.
  worker.on('failed', (job, err) => {
    if (!job) return;
    void (async () => {
      const op = await operationsRepo.get(ctx.db, job.data.operationId);
      const gaveUp = job.attemptsMade >= (job.opts.attempts ?? DEFAULT_ATTEMPTS) || /stalled/i.test(err.message);
      if (!op || isFinished(op.status) || !gaveUp) return;
      const kind = registry.get(job.name);
      const jctx = jobContext(job, job.data.payload, true);
      jctx.log.warn({ err }, 'operation failed for good');
      try {
        await kind?.onFailed?.(jctx, err);
      } finally {
        await finish(op.id, { status: 'failed', error: publicReason(err) });
      }
    })().catch((e) => ctx.log.warn({ err: (e as Error).message }, 'recording a failed job'));
  });
  worker.on('closed', () => publisher.disconnect());
  return worker;
}
