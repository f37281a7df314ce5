import { defineRoute } from '../../http/route';
import { getProject } from '../../../domain/projects';
import { projectParams, projectSchema } from './schemas';

export default defineRoute<unknown, unknown, { project: string }>({
  method: 'get',
  path: '/v1/projects/{project}',
  summary: 'Get a project: its box count, quotas and usage',
  tag: 'projects',
  params: projectParams,
  responses: { 200: { description: 'the project', schema: projectSchema }, 404: { description: 'no such project' } },
  handler: async ({ api, identity, params }) => ({ body: await getProject(api, identity, params.project) }),
});
