import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listGrants } from '../../../domain/grants';
import { grantSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/repohost/grants',
  summary: 'List repository-host grants',
  tag: 'grants',
  access: 'admin',
  responses: { 200: { description: 'grants', schema: Joi.object({ grants: Joi.array().items(grantSchema) }) } },
  handler: async ({ api }) => ({ body: { grants: await listGrants(api.db) } }),
});
