import { defineRoute } from '../../http/route';
import { nodeParams, nodeSchema } from './schemas';

export default defineRoute<unknown, unknown, { id: string }>({
  method: 'get',
  path: '/v1/nodes/{id}',
  summary: 'Get a node',
  tag: 'nodes',
  access: 'admin',
  params: nodeParams,
  responses: { 200: { description: 'the node', schema: nodeSchema }, 404: { description: 'no such node' } },
  handler: async ({ api, params }) => ({ body: await api.nodes.get(params.id) }),
});
