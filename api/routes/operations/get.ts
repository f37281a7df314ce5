import { defineRoute } from '../../http/route';
import { getOperation } from '../../../domain/operations';
import { operationParams, operationSchema } from './schemas';

export default defineRoute<unknown, unknown, { id: string }>({
  method: 'get',
  path: '/v1/operations/{id}',
  summary: 'Get a long operation',
  tag: 'operations',
  params: operationParams,
  responses: { 200: { description: 'the operation', schema: operationSchema }, 404: { description: 'no such operation' } },
  handler: async ({ api, identity, params }) => ({ body: await getOperation(api, identity, params.id) }),
});
