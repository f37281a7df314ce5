import { defineRoute } from '../../http/route';
import { startService } from '../../../domain/services';
import type { ServiceStartRequest } from '../../../core/apiTypes';
import { boxParams, BoxParams } from '../boxes/schemas';
import { serviceSchema, serviceStartBody } from './schemas';

export default defineRoute<ServiceStartRequest, unknown, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/services',
  summary: 'Start a supervised service in a running box (replacing one of the same name); with `ready`, answer once its gate passed',
  tag: 'services',
  params: boxParams,
  body: serviceStartBody,
  responses: {
    201: { description: 'started (its gate passed)', schema: serviceSchema },
    200: { description: 'replaced a service of the same name', schema: serviceSchema },
    400: { description: 'a bad field, a secret_env that is not a key of env, publish without port, a cwd or user the box does not have, a command it cannot find' },
    404: { description: 'no such box' },
    409: { description: 'the box is not running; the publish name is taken; `not_ready`: the ready gate failed (details name it, the message holds the last output lines)' },
  },
  handler: async ({ api, identity, params, body }) => {
    const { service, replaced } = await startService(api, identity, params.project, params.name, body);
    return { status: replaced ? 200 : 201, body: service };
  },
});
