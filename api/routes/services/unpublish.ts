import { defineRoute } from '../../http/route';
import { unpublishService } from '../../../domain/services';
import { serviceParams, ServiceParams } from './schemas';

export default defineRoute<unknown, unknown, ServiceParams>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}/publish',
  summary: "Remove a service's publish",
  tag: 'services',
  params: serviceParams,
  responses: { 204: { description: 'removed' }, 404: { description: 'no such box, or the service has no publish' } },
  handler: async ({ api, identity, params }) => {
    await unpublishService(api, identity, params.project, params.name, params.service);
    return { status: 204 };
  },
});
