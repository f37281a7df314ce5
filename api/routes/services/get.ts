import { defineRoute } from '../../http/route';
import { getService } from '../../../domain/services';
import { serviceErrors, serviceParams, ServiceParams, serviceSchema } from './schemas';

export default defineRoute<unknown, unknown, ServiceParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}',
  summary: 'One service of a running box',
  tag: 'services',
  params: serviceParams,
  responses: { 200: { description: 'the service', schema: serviceSchema }, ...serviceErrors },
  handler: async ({ api, identity, params }) => ({ body: await getService(api, identity, params.project, params.name, params.service) }),
});
