import { defineRoute } from '../../http/route';
import { listVolumes } from '../../../domain/volumes';
import Joi from 'joi';
import { volumeSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/data',
  summary: 'List data volumes (a project-limited token sees its projects\' only)',
  tag: 'data',
  responses: { 200: { description: 'the volumes, by name', schema: Joi.object({ volumes: Joi.array().items(volumeSchema).required() }) } },
  handler: async ({ api, identity }) => ({ status: 200, body: { volumes: await listVolumes(api, identity) } }),
});
