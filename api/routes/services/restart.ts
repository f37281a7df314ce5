import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { controlService } from '../../../domain/services';
import { serviceErrors, serviceParams, ServiceParams, serviceSchema } from './schemas';

export default defineRoute<unknown, unknown, ServiceParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}/restart',
  summary: 'Restart a service (stop with its own signal and grace, then start)',
  tag: 'services',
  params: serviceParams,
  body: Joi.object({}).description('nothing: a field here is refused (400), not ignored'),
  responses: { 200: { description: 'the service as it is now', schema: serviceSchema }, ...serviceErrors },
  handler: async ({ api, identity, params }) => ({ body: await controlService(api, identity, params.project, params.name, params.service, 'restart') }),
});
