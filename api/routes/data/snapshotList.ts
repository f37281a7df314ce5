import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listDataSnapshots } from '../../../domain/volumeData';
import { dataSnapshotSchema, volumeErrors, volumeParams, VolumeParams } from './schemas';

export default defineRoute<unknown, unknown, VolumeParams>({
  method: 'get',
  path: '/v1/data/{name}/snapshots',
  summary: "List a data volume's snapshots, oldest first",
  tag: 'data',
  params: volumeParams,
  responses: { 200: { description: 'its snapshots', schema: Joi.object({ snapshots: Joi.array().items(dataSnapshotSchema).required() }) }, ...volumeErrors },
  handler: async ({ api, identity, params }) => ({ status: 200, body: { snapshots: await listDataSnapshots(api, identity, params.name) } }),
});
