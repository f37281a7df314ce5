import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listBackups } from '../../../domain/volumeData';
import { backupSchema, volumeErrors, volumeParams, VolumeParams } from './schemas';

export default defineRoute<unknown, unknown, VolumeParams>({
  method: 'get',
  path: '/v1/data/{name}/backups',
  summary: "List a data volume's backups, oldest first",
  tag: 'data',
  params: volumeParams,
  responses: { 200: { description: 'its backups', schema: Joi.object({ backups: Joi.array().items(backupSchema).required() }) }, ...volumeErrors },
  handler: async ({ api, identity, params }) => ({ status: 200, body: { backups: await listBackups(api, identity, params.name) } }),
});
