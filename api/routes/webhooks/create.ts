import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { createWebhook } from '../../../domain/webhooks';
import type { CreateWebhookRequest } from '../../../core/apiTypes';
import { webhookSchema } from './schemas';

export default defineRoute<CreateWebhookRequest>({
  method: 'post',
  path: '/v1/webhooks',
  summary: 'Register a URL that gets each later event (verb runs, box lifecycle) of a project, or of every project, as a signed POST, retried with backoff (docs/packs.md "Webhooks")',
  tag: 'packs',
  body: Joi.object({
    url: Joi.string().max(2048).required(),
    project: name().allow(null).description('whose events; left out or null: every project (tokens without a project limit only)'),
    kinds: Joi.array().items(Joi.string().pattern(/^[a-z.]+$/).max(32)).max(16).unique().description('verb, box (every box kind) or box.created, …; all when left out'),
    secret: Joi.string().min(16).max(200).description('the signing secret; generated (and shown only in this answer) when left out'),
  }),
  responses: {
    201: { description: 'registered; the answer alone carries the secret', schema: webhookSchema.keys({ secret: Joi.string().required() }) },
    400: { description: 'a bad URL (scheme, credentials, an address webhooks are not sent to) or kind' },
    404: { description: 'a project the token does not reach' },
    409: { description: 'the project has its most webhooks' },
  },
  handler: async ({ api, identity, body }) => ({ status: 201, body: await createWebhook(api, identity, body) }),
});
