import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { checkHealth } from '../../../domain/health';

export default defineRoute({
  method: 'get',
  path: '/healthz',
  summary: 'Health of the api and what it depends on (db, Redis, storage, workers)',
  tag: 'meta',
  access: 'public',
  responses: {
    200: { description: 'all checks pass', schema: Joi.object({ status: Joi.string().valid('ok'), checks: Joi.object() }) },
    503: { description: 'a check fails', schema: Joi.object({ status: Joi.string().valid('degraded'), checks: Joi.object() }) },
  },
  handler: async ({ api }) => {
    const health = await checkHealth(api);
    return { status: health.status === 'ok' ? 200 : 503, body: health };
  },
});
