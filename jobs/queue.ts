import { ConnectionOptions, Queue, QueueEvents } from 'bullmq';
import type { RedisOptions } from 'ioredis';
import type { Db } from '../db/knex';
import { OperationRow, operationsRepo, isFinished } from '../db/repos/operations';
import { newId, now } from '../core/ids';
import type { JobEnvelope } from './types';

export const DEFAULT_ATTEMPTS = 5;
const FALLBACK_POLL_MS = 500;

/** The queue a host's worker consumes; named per node so several hosts can share one Redis. */
export const nodeQueueName = (nodeId: string) => `node-${nodeId}`;

export interface EnqueueRequest {
  kind: string;
  payload: unknown;
  /** Path a client polls for the resource (`Location`). */
  resource: string;
  /** Operations on one box run one at a time in arrival order. */
  boxId?: string;
  createdBy?: string;
  attempts?: number;
}

/**
 * The api's side of long operations: an `operations` row (the durable record clients poll)
 * plus a BullMQ job carrying its id. The row is written inside the caller's transaction, and the
 * job added last, so a failed add rolls everything back: no row without a job.
 */
export class OperationQueue {
  readonly queue: Queue;
  /** Wakes waiters the moment a job ends, instead of them polling the db on a schedule. */
  private readonly events: QueueEvents;
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(private readonly db: Db, connection: RedisOptions, prefix: string, nodeId: string) {
    // Commands fail fast while Redis is down instead of queueing forever: the api answers 503.
    this.queue = new Queue(nodeQueueName(nodeId), { connection: { ...connection, enableOfflineQueue: false, maxRetriesPerRequest: 1 } as ConnectionOptions, prefix });
    this.queue.on('error', () => undefined);
    this.events = new QueueEvents(nodeQueueName(nodeId), { connection: connection as ConnectionOptions, prefix });
    this.events.on('error', () => undefined);
    const wake = ({ jobId }: { jobId: string }) => {
      for (const w of this.waiters.get(jobId) ?? []) w();
    };
    this.events.on('completed', wake);
    this.events.on('failed', wake);
  }

  /** Resolves when job `id` completes or fails (any attempt), or after `ms`. */
  private nextEvent(id: string, ms: number): { done: Promise<void>; cancel(): void } {
    let timer: NodeJS.Timeout | undefined;
    let wake!: () => void;
    const done = new Promise<void>((resolve) => {
      wake = resolve;
      timer = setTimeout(resolve, ms);
    });
    const set = this.waiters.get(id) ?? new Set();
    set.add(wake);
    this.waiters.set(id, set);
    const cancel = () => {
      clearTimeout(timer);
      set.delete(wake);
      if (set.size === 0) this.waiters.delete(id);
    };
    return { done: done.then(cancel), cancel };
  }

  async enqueue(trx: Db, req: EnqueueRequest): Promise<OperationRow> {
    const at = now();
    const row: Omit<OperationRow, 'seq'> = {
      id: newId('op'),
      kind: req.kind,
      status: 'queued',
      resource: req.resource,
      box_id: req.boxId ?? null,
      progress: null,
      error: null,
      payload: JSON.stringify(req.payload ?? {}),
      created_by: req.createdBy ?? null,
      created_at: at,
      updated_at: at,
    };
    await operationsRepo.insert(trx, row);
    const data: JobEnvelope = { operationId: row.id, payload: req.payload };
    await withTimeout(
      this.queue.add(req.kind, data, {
        jobId: row.id,
        attempts: req.attempts ?? DEFAULT_ATTEMPTS,
        backoff: { type: 'exponential', delay: 1000 },
        removeOnComplete: { age: 24 * 3600, count: 10000 },
        removeOnFail: { age: 7 * 24 * 3600 },
      }),
      5000,
      'the job queue (Redis) is not answering',
    );
    return (await operationsRepo.get(trx, row.id))!;
  }

  /** Answers the operation row once it finishes, or as it is when `timeoutMs` runs out. The
   *  queue's events wake the wait; the db stays the truth, read again at least every 500 ms
   *  in case an event was missed (Redis reconnecting). */
  async waitFor(id: string, timeoutMs: number): Promise<OperationRow | undefined> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      // Listen before reading, so an end that lands between the two is not missed.
      const next = this.nextEvent(id, Math.max(0, Math.min(FALLBACK_POLL_MS, deadline - Date.now())));
      const row = await operationsRepo.get(this.db, id);
      if (!row || isFinished(row.status) || Date.now() >= deadline) {
        next.cancel();
        return row;
      }
      await next.done;
    }
  }

  async counts(): Promise<Record<string, number>> {
    return withTimeout(this.queue.getJobCounts('wait', 'active', 'delayed', 'failed', 'completed'), 2000, 'redis timeout');
  }

  async workersAlive(): Promise<number> {
    return (await withTimeout(this.queue.getWorkers(), 2000, 'redis timeout')).length;
  }

  close = async () => {
    await this.events.close();
    await this.queue.close();
  };
}

export async function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new QueueUnavailableError(message)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } catch (e) {
    if (e instanceof QueueUnavailableError) throw e;
    throw new QueueUnavailableError(`${message}: ${(e as Error).message}`);
  } finally {
    clearTimeout(timer);
  }
}

export class QueueUnavailableError extends Error {}
