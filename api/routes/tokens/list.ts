import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listTokens } from '../../../domain/tokens';
import { tokenSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/tokens',
  summary: 'List API tokens (never their secrets)',
  tag: 'tokens',
  access: 'admin',
  responses: { 200: { description: 'tokens', schema: Joi.object({ tokens: Joi.array().items(tokenSchema) }) } },
  handler: async ({ api }) => ({ body: { tokens: await listTokens(api.db) } }),
});
