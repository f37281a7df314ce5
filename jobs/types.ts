import type Joi from 'joi';
import { UnrecoverableError } from 'bullmq';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { BaseHost, BoxHost, VolumeHost } from './ports';
import type { BoxStatus } from '../core/box';

/** What every job carries besides its kind's own payload. */
export interface JobEnvelope<P = unknown> {
  operationId: string;
  payload: P;
}

/** A job ready to be queued: its kind and a payload of that kind's type. */
export interface JobMessage<P = unknown> {
  kind: string;
  payload: P;
}

/**
 * One kind of job as producers see it: its name, its payload schema, and `of`, which makes a
 * message only from a payload of the right type (the worker checks it again with the schema).
 */
export interface JobType<P> {
  kind: string;
  schema: Joi.Schema<P>;
  of(payload: P): JobMessage<P>;
}

export const jobType = <P>(kind: string, schema: Joi.Schema<P>): JobType<P> => ({ kind, schema, of: (payload) => ({ kind, payload }) });

export interface JobContext<P> {
  payload: P;
  operationId: string;
  /** 1 on the first run, 2 on the first retry… */
  attempt: number;
  /** True when this run is the last one BullMQ will make. */
  lastAttempt: boolean;
  /** The operation was already running when this run began: an earlier run of it died partway
   *  (its worker or the whole host killed), perhaps after its last step. */
  rerun?: boolean;
  db: Db;
  log: Logger;
  /** The host side of the node running the job. */
  node: BoxHost;
  /** Its base steps (save, import). */
  bases: BaseHost;
  /** Its data volume steps. */
  volumes: VolumeHost;
  progress(percent: number): Promise<void>;
  /** Who asked for the operation and when, as its row said when this run began. */
  operation?: { created_by: string | null; created_at: string };
}

/**
 * The handler of one job type. `run` must be idempotent: a worker can die at any line and the
 * job runs again from the top on another worker, so every step checks what is already done.
 */
export interface JobHandler<P = any> {
  type: JobType<P>;
  run(ctx: JobContext<P>): Promise<void>;
  /** Called once when the job has failed for good: write the failure onto the resource. */
  onFailed?(ctx: JobContext<P>, error: Error): Promise<void>;
  attempts?: number;
  /** Always its box's first operation (a create, queued in the transaction that makes the box):
   *  the worker does not look for earlier ones to wait behind. */
  firstOfBox?: boolean;
}

export const defineJob = <P>(handler: JobHandler<P>): JobHandler<P> => handler;

/** A job that cannot run yet: it waits on another one (an instance's create on its pack's base
 *  build). The worker runs it again after `retryInMs` without spending an attempt, the operation
 *  `queued` with `waiting: <message>` as its error meanwhile. */
export class JobNotYet extends Error {
  override name = 'JobNotYet';
  constructor(message: string, readonly retryInMs = 2000) {
    super(message);
  }
}

/** A job that must not run at all (its resource is no longer in a state it applies to): it
 *  fails at once, without retries, and leaves the resource as it is. */
export class JobRefused extends UnrecoverableError {
  override name = 'JobRefused';
  /** For a box transition refused after the box showed its transitional status: the status it
   *  is left in (what it really is, nothing having changed, or the job having put it back). */
  constructor(message: string, readonly leaveStatus?: BoxStatus) {
    super(message);
  }
}
