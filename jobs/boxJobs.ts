import Joi from 'joi';
import type { BoxStatus } from '../db/repos/boxes';
import type { RootSource } from '../workers/drivers';

/** Job kind names of the box lifecycle. */
export const BOX_JOB = {
  create: 'box.create',
  stop: 'box.stop',
  resume: 'box.resume',
  delete: 'box.delete',
} as const;

export interface BoxJobPayload {
  boxId: string;
  /** create only: where the root comes from. */
  source?: RootSource;
}

export const boxJobPayload = Joi.object<BoxJobPayload>({
  boxId: Joi.string().required(),
  source: Joi.object().unknown(true),
});

/** Where each box job leaves the box when it succeeds. */
const RESULT: Record<string, BoxStatus | 'deleted'> = {
  [BOX_JOB.create]: 'running',
  [BOX_JOB.stop]: 'stopped',
  [BOX_JOB.resume]: 'running',
  [BOX_JOB.delete]: 'deleted',
};

/** The status a box will have once the given unfinished operations have run. */
export function projectedStatus(current: BoxStatus, pendingKinds: string[]): BoxStatus {
  let status: BoxStatus | 'deleted' = current;
  for (const k of pendingKinds) status = RESULT[k] ?? status;
  // After a queued delete nothing makes sense: report it as "deleting" so every check refuses.
  return status === 'deleted' ? 'deleting' : status;
}
