import Joi from 'joi';
import type { BoxAction, RootSource } from '../core/box';
import { jobType } from './types';

export interface BoxRef {
  boxId: string;
}

export interface BoxCreatePayload extends BoxRef {
  /** Where the root comes from: a base version, or another box (a fork). */
  source: RootSource;
}

const boxId = Joi.string().pattern(/^[a-z0-9]{1,32}$/).required();
const boxRef = Joi.object<BoxRef>({ boxId });
const rootSource = Joi.alternatives(
  Joi.object({ kind: Joi.valid('base').required(), base: Joi.object({ name: Joi.string().required(), version: Joi.string().required() }).required() }),
  Joi.object({ kind: Joi.valid('box').required(), boxId: Joi.string().required(), snapshot: Joi.string() }),
);

/** The job types of the box lifecycle, one per action of the state machine. */
export const boxJobs = {
  create: jobType<BoxCreatePayload>('box.create', Joi.object<BoxCreatePayload>({ boxId, source: rootSource.required() })),
  stop: jobType<BoxRef>('box.stop', boxRef),
  resume: jobType<BoxRef>('box.resume', boxRef),
  delete: jobType<BoxRef>('box.delete', boxRef),
} as const;

/** The state-machine action a job kind carries out (undefined for other kinds). */
export function boxActionOf(kind: string): BoxAction | undefined {
  for (const [action, t] of Object.entries(boxJobs)) if (t.kind === kind) return action as BoxAction;
  return undefined;
}
