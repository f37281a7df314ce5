import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { nodeSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/nodes',
  summary: 'List the nodes (machines that hold boxes): state, health, capacity, what is committed',
  tag: 'nodes',
  access: 'admin',
  responses: { 200: { description: 'nodes', schema: Joi.object({ nodes: Joi.array().items(nodeSchema) }) } },
  handler: async ({ api }) => ({ body: { nodes: await api.nodes.list() } }),
});
