import { defineRoute } from '../../http/route';
import { nodeParams } from './schemas';

export default defineRoute<unknown, unknown, { id: string }>({
  method: 'delete',
  path: '/v1/nodes/{id}',
  summary: 'Forget a node that is stopped and holds no boxes',
  tag: 'nodes',
  access: 'admin',
  params: nodeParams,
  responses: { 204: { description: 'forgotten' }, 404: { description: 'no such node' }, 409: { description: 'it holds boxes, or it is up' } },
  handler: async ({ api, params }) => {
    await api.nodes.remove(params.id);
    return { status: 204 };
  },
});
