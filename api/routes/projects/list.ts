import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listProjects } from '../../../domain/projects';

export default defineRoute({
  method: 'get',
  path: '/v1/projects',
  summary: 'List projects (made by their first box)',
  tag: 'projects',
  responses: {
    200: { description: 'projects', schema: Joi.object({ projects: Joi.array().items(Joi.object({ name: Joi.string(), created_at: Joi.string(), box_count: Joi.number() })) }) },
  },
  handler: async ({ api, identity }) => ({ body: { projects: await listProjects(api, identity) } }),
});
