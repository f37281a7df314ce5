import type Joi from 'joi';
import type { Logger } from '../core/logger';
import type { WorkerContext } from '../workers/context';

/** What every job carries besides its kind's own payload. */
export interface JobEnvelope<P = unknown> {
  operationId: string;
  payload: P;
}

export interface JobContext<P> {
  payload: P;
  operationId: string;
  /** 1 on the first run, 2 on the first retry… */
  attempt: number;
  /** True when this run is the last one BullMQ will make. */
  lastAttempt: boolean;
  host: WorkerContext;
  log: Logger;
  progress(percent: number): Promise<void>;
}

/**
 * One kind of long operation. `run` must be idempotent: a worker can die at any line and the
 * job runs again from the top on another worker, so every step checks what is already done.
 */
export interface JobKind<P = any> {
  kind: string;
  payload: Joi.Schema<P>;
  run(ctx: JobContext<P>): Promise<void>;
  /** Called once when the job has failed for good: write the failure onto the resource. */
  onFailed?(ctx: JobContext<P>, error: Error): Promise<void>;
  attempts?: number;
}

export const defineJob = <P>(kind: JobKind<P>): JobKind<P> => kind;
