import Joi from 'joi';
import { name, projectParam, timestamp } from '../../http/schemas';
import { mountPath } from '../boxes/schemas';
import { snapshotSchema, MAX_DESCRIPTION_CHARS } from '../snapshots/schemas';

export const volumeParams = Joi.object({ name: name().required() });
export type VolumeParams = { name: string };
export const volumeSnapshotParams = Joi.object({ name: name().required(), snapshot: name().required() });
export type VolumeSnapshotParams = { name: string; snapshot: string };
export const backupParams = Joi.object({ name: name().required(), backup: name().required() });
export type BackupParams = { name: string; backup: string };

/** One line, as a box snapshot's (ZFS keeps it as a property). */
export const snapshotDescription = () => Joi.string().allow('').max(MAX_DESCRIPTION_CHARS).pattern(/^[^\x00-\x1f\x7f]*$/).messages({ 'string.pattern.base': 'must be one line without control characters' });

export const attachmentSchema = Joi.object({ project: Joi.string().required(), box: Joi.string().required(), path: Joi.string().required(), read_only: Joi.boolean().required() }).label('DataAttachment');

export const volumeSchema = Joi.object({
  name: Joi.string().required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
  size_bytes: Joi.number().integer().min(0).required().description('bytes the volume holds, its snapshots included'),
  quota_gb: Joi.number().integer().min(1).required(),
  description: Joi.string().allow(null, '').required(),
  attachments: Joi.array().items(attachmentSchema).required(),
  project: Joi.string().allow(null).required().description('the project whose boxes it attaches to (null until its first attach, for a volume made without one)'),
  node: Joi.string().required().description('the node that holds it; it attaches to boxes on that node'),
}).label('DataVolume');

export const dataSnapshotSchema = snapshotSchema.label('DataSnapshot');

export const backupSchema = Joi.object({
  name: Joi.string().required(),
  status: Joi.valid('pending', 'running', 'completed', 'failed').required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
  description: Joi.string().allow(null, ''),
  error: Joi.string().allow(null),
  mode: Joi.valid('full', 'incremental', null),
  parent: Joi.string().allow(null),
  size_bytes: Joi.number().integer().min(0).allow(null).description('bytes of the stream written'),
  sha256: Joi.string().allow(null).description('sha256 of the stream, checked before a restore'),
}).label('DataBackup');

export const projectBox = { project: projectParam.required(), box: name().required() };
export { mountPath };

export const volumeErrors = {
  404: { description: 'no such data volume (or not one this token may see)' },
  503: { description: "the volume's node is not answering" },
};
