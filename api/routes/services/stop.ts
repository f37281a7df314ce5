import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { controlService } from '../../../domain/services';
import { serviceErrors, serviceParams, ServiceParams, serviceSchema, signalName } from './schemas';
import { MAX_STOP_GRACE_SECS } from '../../../core/box';

export default defineRoute<{ signal?: string; grace_secs?: number }, unknown, ServiceParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/services/{service}/stop',
  summary: "Stop a service (its signal, then SIGKILL after the grace); it stays stopped across the box's restarts until started",
  tag: 'services',
  params: serviceParams,
  body: Joi.object({ signal: signalName(), grace_secs: Joi.number().integer().min(0).max(MAX_STOP_GRACE_SECS) }),
  responses: { 200: { description: 'the service as it is now', schema: serviceSchema }, ...serviceErrors },
  handler: async ({ api, identity, params, body }) => ({ body: await controlService(api, identity, params.project, params.name, params.service, 'stop', body ?? {}) }),
});
