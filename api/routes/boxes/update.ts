import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { tagMap } from '../../http/schemas';
import { updateBox, UpdateBoxRequest } from '../../../domain/boxes';
import { boxParams, BoxParams, boxSchema, configSchema } from './schemas';
import { MAX_STOP_GRACE_SECS } from '../../../core/box';

export default defineRoute<UpdateBoxRequest, unknown, BoxParams>({
  method: 'put',
  path: '/v1/projects/{project}/boxes/{name}',
  summary: 'Update a box: cpus and ram_mb (live), tags (replaced whole), grace period',
  tag: 'boxes',
  params: boxParams,
  body: Joi.object({
    config: configSchema.fork(['region', 'storage_gb'], (s) => s.forbidden()),
    tags: tagMap(),
    termination_grace_period_seconds: Joi.number().integer().min(0).max(MAX_STOP_GRACE_SECS)
      .description(`seconds between SIGTERM and SIGKILL at stop; at most ${MAX_STOP_GRACE_SECS}`),
  }),
  responses: { 200: { description: 'the box', schema: boxSchema }, 404: { description: 'no such box' }, 409: { description: 'being deleted' } },
  handler: async ({ api, identity, params, body }) => ({ body: await updateBox(api, identity, params.project, params.name, body) }),
});
