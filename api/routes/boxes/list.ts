import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { NAME_PATTERN } from '../../http/schemas';
import { listBoxes, ListBoxesQuery } from '../../../domain/boxList';
import { MAX_PAGE } from '../../../domain/paging';
import { boxSchema } from './schemas';

export default defineRoute<unknown, ListBoxesQuery, { project: string }>({
  method: 'get',
  path: '/v1/projects/{project}/boxes',
  summary: 'List boxes of a project (`-` for every project the token sees)',
  tag: 'boxes',
  params: Joi.object({ project: Joi.alternatives(Joi.string().valid('-'), Joi.string().pattern(NAME_PATTERN)).required() }),
  query: Joi.object({
    prefix: Joi.string().pattern(/^[a-z0-9-]*$/).max(63).allow(''),
    tag: Joi.string().max(1024).allow(''),
    max_results: Joi.number().integer().min(0).max(MAX_PAGE).description('0 means the default, 100'),
    continuation_token: Joi.string().max(1024),
  }),
  responses: {
    200: {
      description: 'a page of boxes',
      schema: Joi.object({ boxes: Joi.array().items(boxSchema).required(), has_more: Joi.boolean().required(), next_continuation_token: Joi.string().allow(null).required() }),
    },
  },
  handler: async ({ api, identity, params, query }) => ({ body: await listBoxes(api, identity, params.project, query) }),
});
