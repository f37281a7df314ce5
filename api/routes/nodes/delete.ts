import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { nodeParams } from './schemas';

export default defineRoute<unknown, { force: boolean }, { id: string }>({
  method: 'delete',
  path: '/v1/nodes/{id}',
  summary: 'Forget a node that is down: an empty one, or with force one gone for good (its boxes are marked failed and lost)',
  tag: 'nodes',
  access: 'admin',
  params: nodeParams,
  query: Joi.object({ force: Joi.boolean().default(false).description('forget a node that still holds boxes: they are lost') }),
  responses: { 204: { description: 'forgotten' }, 404: { description: 'no such node' }, 409: { description: 'it is up, or holds boxes (without force)' } },
  handler: async ({ api, params, query }) => {
    await api.nodes.remove(params.id, { force: query.force, queue: api.queue });
    return { status: 204 };
  },
});
