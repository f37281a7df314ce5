import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name, projectParam } from '../../http/schemas';
import { unpublishBox } from '../../../domain/publishes';

export default defineRoute<unknown, unknown, { project: string; name: string; publish: string }>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}/publish/{publish}',
  summary: 'Remove a publish of a box (a service\'s publish too, by its name)',
  tag: 'publish',
  params: Joi.object({ project: projectParam.required(), name: name().required(), publish: name().required() }),
  responses: { 204: { description: 'removed' }, 404: { description: 'no such box or publish' } },
  handler: async ({ api, identity, params }) => {
    await unpublishBox(api, identity, params.project, params.name, params.publish);
    return { status: 204 };
  },
});
