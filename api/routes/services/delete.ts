import { defineRoute } from '../../http/route';
import { deleteService } from '../../../domain/services';
import { serviceErrors, serviceParams, ServiceParams } from './schemas';

export default defineRoute<unknown, unknown, ServiceParams>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}',
  summary: 'Stop a service and remove it (its spec, logs and publish); a corrupt tombstone goes the same way',
  tag: 'services',
  params: serviceParams,
  responses: { 204: { description: 'removed' }, ...serviceErrors },
  handler: async ({ api, identity, params }) => {
    await deleteService(api, identity, params.project, params.name, params.service);
    return { status: 204 };
  },
});
