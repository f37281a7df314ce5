import Joi from 'joi';
import type { BoxAction, RootSource } from '../core/box';
import { jobType } from './types';
import { NAME_PATTERN } from '../core/names';

export interface BoxRef {
  boxId: string;
}

export interface BoxCreatePayload extends BoxRef {
  /** Where the root comes from: a base version, or another box (a fork). */
  source: RootSource;
}

export interface BoxSnapshotPayload extends BoxRef {
  /** The snapshot's name (the name rule) and its one-line description. */
  name: string;
  description?: string;
}

export interface BoxResumePayload extends BoxRef {
  /** `failed`: the box was failed when the resume was asked for (the api shows `resuming` at
   *  once, so the job cannot read it off the row). */
  from?: 'stopped' | 'failed';
}

export interface BoxRestorePayload extends BoxRef {
  snapshot: string;
  /** The status the box had when the restore was asked for (running or stopped): where a
   *  refused restore leaves it. */
  from?: 'running' | 'stopped';
}

const boxId = Joi.string().pattern(/^[a-z0-9]{1,32}$/).required();
const boxRef = Joi.object<BoxRef>({ boxId });
const rootSource = Joi.alternatives(
  Joi.object({ kind: Joi.valid('base').required(), base: Joi.object({ name: Joi.string().required(), version: Joi.string().required() }).required() }),
  Joi.object({ kind: Joi.valid('box').required(), boxId: Joi.string().required(), snapshot: Joi.string() }),
);

const snapshotName = Joi.string().pattern(NAME_PATTERN);

/** The job types of the box lifecycle, one per action of the state machine. */
export const boxJobs = {
  create: jobType<BoxCreatePayload>('box.create', Joi.object<BoxCreatePayload>({ boxId, source: rootSource.required() })),
  stop: jobType<BoxRef>('box.stop', boxRef),
  resume: jobType<BoxResumePayload>('box.resume', Joi.object<BoxResumePayload>({ boxId, from: Joi.valid('stopped', 'failed') })),
  restore: jobType<BoxRestorePayload>('box.restore', Joi.object<BoxRestorePayload>({ boxId, snapshot: snapshotName.required(), from: Joi.valid('running', 'stopped') })),
  delete: jobType<BoxRef>('box.delete', boxRef),
} as const satisfies Record<BoxAction, unknown>;

/** Box jobs that leave the box's status as it is (they run in turn with the others). */
export const boxSnapshotJob = jobType<BoxSnapshotPayload>('box.snapshot', Joi.object<BoxSnapshotPayload>({ boxId, name: snapshotName.required(), description: Joi.string().max(1024) }));

/** The state-machine action a job kind carries out (undefined for other kinds). */
export function boxActionOf(kind: string): BoxAction | undefined {
  for (const [action, t] of Object.entries(boxJobs)) if (t.kind === kind) return action as BoxAction;
  return undefined;
}
