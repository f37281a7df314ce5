import { defineRoute } from '../../http/route';
import Joi from 'joi';
import { listBases } from '../../../domain/bases';
import { baseSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/bases',
  summary: 'Bases a box can be made from: every version, newest first within a name',
  tag: 'bases',
  responses: { 200: { description: 'the bases', schema: Joi.object({ bases: Joi.array().items(baseSchema) }).label('BaseList') } },
  handler: async ({ api, identity }) => ({ body: { bases: await listBases(api, identity) } }),
});
