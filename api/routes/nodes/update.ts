import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { nodeParams, nodeSchema } from './schemas';

export default defineRoute<{ state: 'active' | 'draining' }, unknown, { id: string }>({
  method: 'put',
  path: '/v1/nodes/{id}',
  summary: 'Drain a node (it keeps its boxes, new ones go elsewhere) or make it active again',
  tag: 'nodes',
  access: 'admin',
  params: nodeParams,
  body: Joi.object({ state: Joi.string().valid('active', 'draining').required() }),
  responses: { 200: { description: 'the node', schema: nodeSchema }, 404: { description: 'no such node' } },
  handler: async ({ api, params, body }) => ({ body: await api.nodes.setState(params.id, body.state) }),
});
