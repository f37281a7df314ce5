import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { timestamp } from '../../http/schemas';
import { TICKET_TTL_MS } from '../../../domain/tickets';

export default defineRoute<Record<string, never>>({
  method: 'post',
  path: '/v1/tickets',
  summary: `A single-use ticket for one WebSocket handshake (\`?ticket=\`), valid ${TICKET_TTL_MS / 1000} s, bound to the caller's token`,
  tag: 'tickets',
  body: Joi.object({}).description('empty'),
  responses: {
    201: { description: 'the ticket', schema: Joi.object({ ticket: Joi.string(), expires_at: timestamp() }) },
  },
  handler: async ({ api, identity }) => ({ status: 201, body: await api.limits.tickets.issue(identity) }),
});
