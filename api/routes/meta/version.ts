import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { versionInfo } from '../../../core/version';

export default defineRoute({
  method: 'get',
  path: '/version',
  summary: 'API and server version',
  tag: 'meta',
  access: 'public',
  responses: {
    200: { description: 'versions', schema: Joi.object({ api_version: Joi.string(), version: Joi.string(), commit: Joi.string() }) },
  },
  handler: async () => ({ body: versionInfo() }),
});
