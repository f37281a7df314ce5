import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listServices } from '../../../domain/services';
import { boxParams, BoxParams } from '../boxes/schemas';
import { serviceErrors, serviceSchema } from './schemas';

export default defineRoute<unknown, unknown, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}/services',
  summary: "A running box's services, by name (a spec that does not load is a `corrupt` tombstone)",
  tag: 'services',
  params: boxParams,
  responses: { 200: { description: 'its services', schema: Joi.object({ services: Joi.array().items(serviceSchema) }) }, ...serviceErrors },
  handler: async ({ api, identity, params }) => ({ body: { services: await listServices(api, identity, params.project, params.name) } }),
});
