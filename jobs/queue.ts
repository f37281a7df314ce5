import { EventEmitter } from 'node:events';
import { Queue } from 'bullmq';
import IORedis, { RedisOptions } from 'ioredis';
import type { Db } from '../db/knex';
import { OperationRow, operationsRepo, isFinished } from '../db/repos/operations';
import { newId, now } from '../core/ids';
import type { JobEnvelope, JobMessage } from './types';

export const DEFAULT_ATTEMPTS = 5;
const FALLBACK_POLL_MS = 500;

/** The queue of one node: its workers consume it, and only it (DESIGN.md §1). */
export const nodeQueueName = (nodeId: string) => `node-${nodeId}`;

/** Workers publish an operation's id here when it ends, so waiters wake at once. */
export const operationsChannel = (prefix: string) => `${prefix}:operations:ended`;

/** Ends announced by a worker in this process (an api and a node in one, as `npm start` runs):
 *  its waiters wake without the round trip through Redis, which still carries it to the others. */
const localEnds = new EventEmitter().setMaxListeners(0);
export const announceLocally = (id: string): void => void localEnds.emit('ended', id);

export interface EnqueueMeta {
  /** Path a client polls for the resource (`Location`). */
  resource: string;
  /** The node whose queue takes the job. */
  node: string;
  /** The project whose tokens may read the operation (absent: host-wide). */
  project?: string;
  /** Operations on one box run one at a time in arrival order. */
  boxId?: string;
  createdBy?: string;
  attempts?: number;
}

/**
 * The producer side of long operations: an `operations` row (the durable record clients poll)
 * plus a BullMQ job on the owning node's queue carrying its id. The row is written inside the
 * caller's transaction and the job added last, so a failed add rolls everything back: no row
 * without a job. All queues share one Redis connection, and one subscription wakes waiters.
 */
export class OperationQueue {
  private readonly queues = new Map<string, Queue>();
  private readonly client: IORedis;
  private readonly subscriber: IORedis;
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(
    private readonly db: Db,
    connection: RedisOptions,
    private readonly prefix: string,
  ) {
    // Commands fail fast while Redis is down instead of queueing forever: the api answers 503.
    this.client = new IORedis({ ...connection, enableOfflineQueue: false, maxRetriesPerRequest: 1 });
    this.client.on('error', () => undefined);
    this.subscriber = new IORedis({ ...connection, maxRetriesPerRequest: null });
    this.subscriber.on('error', () => undefined);
    void this.subscriber.subscribe(operationsChannel(prefix)).catch(() => undefined);
    this.subscriber.on('message', (_channel, id: string) => this.wake(id));
    localEnds.on('ended', this.wake);
  }

  private readonly wake = (id: string): void => {
    for (const w of this.waiters.get(id) ?? []) {
      try {
        w();
      } catch {
        /* a waiter's wake only resolves a promise */
      }
    }
  };

  /** Resolves once the connection is up (or after `timeoutMs`: an api may start while Redis
   *  is down, and answers 503 until it is back). Commands fail fast rather than queue, so
   *  the first requests after a start would otherwise find no connection yet. */
  async ready(timeoutMs = 5000): Promise<void> {
    if (this.client.status === 'ready') return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, timeoutMs);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.client.once('ready', done);
    });
  }

  /** The BullMQ queue of a node (made on first use). */
  queueOf(node: string): Queue {
    let q = this.queues.get(node);
    if (!q) {
      q = new Queue(nodeQueueName(node), { connection: this.client, prefix: this.prefix });
      q.on('error', () => undefined);
      this.queues.set(node, q);
    }
    return q;
  }

  /** Resolves when operation `id` is announced as ended, or after `ms`. */
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

  async enqueue<P>(trx: Db, msg: JobMessage<P>, meta: EnqueueMeta): Promise<OperationRow> {
    const at = now();
    const row: Omit<OperationRow, 'seq'> = {
      id: newId('op'),
      kind: msg.kind,
      status: 'queued',
      resource: meta.resource,
      box_id: meta.boxId ?? null,
      project: meta.project ?? null,
      node: meta.node,
      progress: null,
      error: null,
      payload: JSON.stringify(msg.payload ?? {}),
      created_by: meta.createdBy ?? null,
      created_at: at,
      updated_at: at,
    };
    const inserted = await operationsRepo.insertReturning(trx, row);
    const data: JobEnvelope<P> = { operationId: row.id, payload: msg.payload };
    await withTimeout(
      this.queueOf(meta.node).add(msg.kind, data, {
        jobId: row.id,
        attempts: meta.attempts ?? DEFAULT_ATTEMPTS,
        backoff: { type: 'exponential', delay: 1000 },
        removeOnComplete: { age: 24 * 3600, count: 10000 },
        removeOnFail: { age: 7 * 24 * 3600 },
      }),
      5000,
      'the job queue (Redis) is not answering',
    );
    return inserted;
  }

  /** Records an operation that needed no job (it is done as it is taken): succeeded at once. */
  async recordDone<P>(trx: Db, msg: JobMessage<P>, meta: EnqueueMeta): Promise<OperationRow> {
    const at = now();
    const id = newId('op');
    await operationsRepo.insert(trx, {
      id, kind: msg.kind, status: 'succeeded', resource: meta.resource, box_id: meta.boxId ?? null, project: meta.project ?? null, node: meta.node,
      progress: 100, error: null, payload: JSON.stringify(msg.payload ?? {}), created_by: meta.createdBy ?? null, created_at: at, updated_at: at,
    });
    return (await operationsRepo.get(trx, id))!;
  }

  /** Drops a node's queue and every job in it (a node removed for good). */
  async drop(node: string): Promise<void> {
    await withTimeout(this.queueOf(node).obliterate({ force: true }), 10_000, 'the job queue (Redis) is not answering');
    await this.queueOf(node).close();
    this.queues.delete(node);
  }

  /** Answers the operation row once it finishes, or as it is when `timeoutMs` runs out. The
   *  workers' announcements wake the wait; the db stays the truth, read again at least every
   *  500 ms in case an announcement was missed (Redis reconnecting). */
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

  /** Jobs by state on one node's queue. */
  async counts(node: string): Promise<Record<string, number>> {
    return withTimeout(this.queueOf(node).getJobCounts('wait', 'active', 'delayed', 'failed', 'completed'), 2000, 'redis timeout');
  }

  /** Worker processes connected to one node's queue. */
  async workersAlive(node: string): Promise<number> {
    return (await withTimeout(this.queueOf(node).getWorkers(), 2000, 'redis timeout')).length;
  }

  async ping(): Promise<void> {
    await withTimeout(this.client.ping(), 2000, 'redis timeout');
  }

  close = async () => {
    localEnds.off('ended', this.wake);
    for (const q of this.queues.values()) await q.close();
    this.subscriber.disconnect();
    this.client.disconnect();
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
