import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { waitOperation } from '../../../domain/operations';
import { operationParams, operationSchema } from './schemas';

export default defineRoute<unknown, { timeout: number }, { id: string }>({
  method: 'get',
  path: '/v1/operations/{id}/wait',
  summary: 'Wait for a long operation to finish',
  tag: 'operations',
  params: operationParams,
  query: Joi.object({ timeout: Joi.number().min(0).max(300).default(30) }),
  responses: {
    200: { description: 'the finished operation', schema: operationSchema },
    404: { description: 'no such operation' },
    408: { description: 'still running at the timeout' },
  },
  handler: async ({ api, identity, params, query }) => ({ body: await waitOperation(api, identity, params.id, query.timeout) }),
});
