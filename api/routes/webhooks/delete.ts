import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { deleteWebhook } from '../../../domain/webhooks';

export default defineRoute<unknown, unknown, { id: string }>({
  method: 'delete',
  path: '/v1/webhooks/{id}',
  summary: 'Remove a webhook (deliveries under way for it are dropped)',
  tag: 'packs',
  params: Joi.object({ id: Joi.string().max(64).required() }),
  responses: { 204: { description: 'removed' }, 404: { description: 'no such webhook the token sees' } },
  handler: async ({ api, identity, params }) => {
    await deleteWebhook(api, identity, params.id);
    return { status: 204 };
  },
});
