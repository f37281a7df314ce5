import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { timestamp } from '../../http/schemas';
import { listEvents, ListEventsQuery } from '../../../domain/events';
import { MAX_PAGE } from '../../../domain/paging';
import { eventFilters, eventSchema } from './schemas';

export default defineRoute<unknown, ListEventsQuery>({
  method: 'get',
  path: '/v1/events',
  summary: 'Pack verb-execution events, newest first (a project-limited token sees its projects\')',
  tag: 'events',
  query: Joi.object({
    ...eventFilters,
    since: timestamp().description('only events at or after this instant'),
    max_results: Joi.number().integer().min(0).max(MAX_PAGE).description('0 means the default, 100'),
    continuation_token: Joi.string().max(1024),
  }),
  responses: {
    200: {
      description: 'a page of events',
      schema: Joi.object({ events: Joi.array().items(eventSchema).required(), has_more: Joi.boolean().required(), next_continuation_token: Joi.string().allow(null).required() }),
    },
    400: { description: 'a bad filter, max_results over 1000, a continuation token this api did not give' },
    404: { description: 'a project the token may not see' },
  },
  handler: async ({ api, identity, query }) => ({ body: await listEvents(api, identity, query) }),
});
