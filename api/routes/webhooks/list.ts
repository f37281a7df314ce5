import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { listWebhooks } from '../../../domain/webhooks';
import { webhookSchema } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/webhooks',
  summary: "List webhooks (a project token: its projects' only), with how each one's latest delivery went; never their secrets",
  tag: 'packs',
  responses: { 200: { description: 'webhooks', schema: Joi.object({ webhooks: Joi.array().items(webhookSchema) }) } },
  handler: async ({ api, identity }) => ({ body: { webhooks: await listWebhooks(api, identity) } }),
});
