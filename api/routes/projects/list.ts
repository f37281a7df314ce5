import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listProjects } from '../../../domain/projects';
import { projectSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/projects',
  summary: 'List projects (made by their first box) with their quotas and usage',
  tag: 'projects',
  responses: { 200: { description: 'projects', schema: Joi.object({ projects: Joi.array().items(projectSchema) }) } },
  handler: async ({ api, identity }) => ({ body: { projects: await listProjects(api, identity) } }),
});
