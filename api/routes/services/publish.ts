import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { publishService } from '../../../domain/services';
import { publishOptions, publishSchema, serviceErrors, serviceParams, ServiceParams } from './schemas';

export default defineRoute<{ name?: string; public?: boolean; force?: boolean }, unknown, ServiceParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}/publish',
  summary: "Publish a service's port at <name>--<box>--<project>.<publish domain> (a service has at most one publish)",
  tag: 'services',
  params: serviceParams,
  body: Joi.object(publishOptions('the service name')),
  responses: {
    201: { description: 'published', schema: publishSchema },
    200: { description: 'replaced a publish', schema: publishSchema },
    400: { description: 'the service has no port' },
    ...serviceErrors,
    409: { description: 'the box is not running, or the name is taken (without force)' },
  },
  handler: async ({ api, identity, params, body }) => {
    const { publish, replaced } = await publishService(api, identity, params.project, params.name, params.service, body ?? {});
    return { status: replaced ? 200 : 201, body: publish };
  },
});
