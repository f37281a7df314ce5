import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listPacks } from '../../../domain/packs';
import { packSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/packs',
  summary: 'List the installed packs',
  tag: 'packs',
  responses: { 200: { description: 'packs by name', schema: Joi.object({ packs: Joi.array().items(packSchema).required() }) } },
  handler: async ({ api }) => ({ body: { packs: await listPacks(api) } }),
});
