import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { operationHeaders, waitQuery } from '../../http/operation';
import { createBackup } from '../../../domain/volumeData';
import type { CreateDataBackupRequest } from '../../../core/apiTypes';
import { backupSchema, volumeErrors, volumeParams, VolumeParams } from './schemas';

export default defineRoute<CreateDataBackupRequest, { wait?: number }, VolumeParams>({
  method: 'post',
  path: '/v1/data/{name}/backups',
  summary: 'Back up a data volume: a zfs send stream (full, then incremental on the previous backup) written to the backup directory with its sha256',
  tag: 'data',
  params: volumeParams,
  query: Joi.object(waitQuery),
  body: Joi.object({
    name: name().allow(null).description('the backup name rule; absent or null: a generated name (b-YYYYMMDD-HHMMSS-xxxx)'),
    description: Joi.string().allow('', null).max(1024),
  }),
  responses: {
    202: { description: 'accepted: the backup, pending; poll Location (the backup) or the operation', schema: backupSchema },
    200: { description: 'with ?wait: the backup once it completed or failed', schema: backupSchema },
    400: { description: 'a name that breaks the backup name rule ("" included)' },
    409: { description: 'the volume already has a backup of that name; it is being made or deleted' },
    ...volumeErrors,
  },
  handler: async ({ api, identity, params, body, query }) => {
    const started = await createBackup(api, identity, params.name, body);
    const headers = operationHeaders(started.operation);
    if (query.wait) {
      const done = await api.queue.waitFor(started.operation.id, query.wait * 1000);
      if (done && (done.status === 'succeeded' || done.status === 'failed')) return { status: 200, body: (await started.load()) ?? started.backup, headers };
    }
    return { status: 202, body: (await started.load()) ?? started.backup, headers };
  },
});
