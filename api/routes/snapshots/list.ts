import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listSnapshots } from '../../../domain/snapshots';
import { boxParams, BoxParams } from '../boxes/schemas';
import { snapshotErrors, snapshotSchema } from './schemas';

export default defineRoute<unknown, unknown, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/snapshots',
  summary: "A box's snapshots, oldest first",
  tag: 'snapshots',
  params: boxParams,
  responses: { 200: { description: 'its snapshots', schema: Joi.object({ snapshots: Joi.array().items(snapshotSchema) }) }, ...snapshotErrors },
  handler: async ({ api, identity, params }) => ({ body: { snapshots: await listSnapshots(api, identity, params.project, params.name) } }),
});
