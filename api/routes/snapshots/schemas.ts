import Joi from 'joi';
import { name, projectParam, timestamp } from '../../http/schemas';

export const snapshotParams = Joi.object({ project: projectParam.required(), name: name().required(), snapshot: name().required() });
export type SnapshotParams = { project: string; name: string; snapshot: string };

/** One line: ZFS keeps it as a property of the snapshot (docs/snapshots.md). */
export const MAX_DESCRIPTION_CHARS = 200;

export const snapshotSchema = Joi.object({
  name: Joi.string().required(),
  created_at: timestamp().required(),
  size_bytes: Joi.number().integer().min(0).required().description('the blocks only this snapshot holds (what deleting it frees)'),
  description: Joi.string(),
}).label('BoxSnapshot');

export const snapshotErrors = {
  404: { description: 'no such box or snapshot' },
  503: { description: "the box's node is not answering" },
};
