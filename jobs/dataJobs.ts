import Joi from 'joi';
import { NAME_PATTERN } from '../core/names';
import { jobType } from './types';

/** Volume ids name datasets: `v` + lowercase alphanumerics (core/ids.ts `newVolumeId`). */
export const VOLUME_ID_PATTERN = /^v[a-z0-9]{1,31}$/;

export interface VolumeRef {
  volumeId: string;
}

export interface DataCreatePayload extends VolumeRef {
  quotaGb: number;
}

export interface DataSnapshotPayload extends VolumeRef {
  name: string;
  description?: string;
}

export interface DataBackupPayload extends VolumeRef {
  /** The backup's row (its name, and where the job records mode, parent, size and sha256). */
  backupId: string;
}

/** Exactly one of `snapshot` and `backupId`; `node` (with a backup): the node the volume moves
 *  to, the one the job runs on. */
export interface DataRestorePayload extends VolumeRef {
  snapshot?: string;
  backupId?: string;
  node?: string;
}

const volumeId = Joi.string().pattern(VOLUME_ID_PATTERN).required();
const ref = Joi.object<VolumeRef>({ volumeId });
const snapshotName = Joi.string().pattern(NAME_PATTERN);
const backupId = Joi.string().pattern(/^bk_[a-z0-9]{20}$/);

/** The job kinds of data volumes (docs/data.md), run in turn per volume on its node. */
export const dataJobs = {
  create: jobType<DataCreatePayload>('data.create', Joi.object<DataCreatePayload>({ volumeId, quotaGb: Joi.number().integer().min(1).required() })),
  delete: jobType<VolumeRef>('data.delete', ref),
  snapshot: jobType<DataSnapshotPayload>('data.snapshot', Joi.object<DataSnapshotPayload>({ volumeId, name: snapshotName.required(), description: Joi.string().max(1024) })),
  deleteSnapshot: jobType<DataSnapshotPayload>('data.snapshot.delete', Joi.object<DataSnapshotPayload>({ volumeId, name: snapshotName.required() })),
  backup: jobType<DataBackupPayload>('data.backup', Joi.object<DataBackupPayload>({ volumeId, backupId: backupId.required() })),
  restore: jobType<DataRestorePayload>('data.restore', Joi.object<DataRestorePayload>({ volumeId, snapshot: snapshotName, backupId, node: Joi.string().pattern(/^[a-z0-9][a-z0-9-]{0,62}$/) }).xor('snapshot', 'backupId').with('node', 'backupId')),
} as const;

/** The key operations on one volume are ordered by (the operations' `box_id` column holds it:
 *  box ids never contain a colon). */
export const volumeTurnKey = (volumeId: string) => `data:${volumeId}`;
