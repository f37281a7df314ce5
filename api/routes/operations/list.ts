import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { listOperations, ListOperationsQuery } from '../../../domain/operations';
import { MAX_PAGE } from '../../../domain/paging';
import { operationSchema, OPERATION_STATUSES } from './schemas';

const statusList = new RegExp(`^(${OPERATION_STATUSES.join('|')})(,(${OPERATION_STATUSES.join('|')}))*$`);

export default defineRoute<unknown, ListOperationsQuery>({
  method: 'get',
  path: '/v1/operations',
  summary: 'Long operations, newest first (a project-limited token sees its projects\'); finished ones while they are kept',
  tag: 'operations',
  query: Joi.object({
    project: name(),
    box: name().description('only operations on this box (needs project); a deleted box\'s too'),
    status: Joi.string().pattern(statusList).description('only these statuses, comma-separated (queued,running: what is still to happen)'),
    kind: Joi.string().max(64).pattern(/^[a-z0-9_.-]+$/).description('only this kind (box.create, box.stop, …)'),
    max_results: Joi.number().integer().min(0).max(MAX_PAGE).description('0 means the default, 100'),
    continuation_token: Joi.string().max(1024),
  }),
  responses: {
    200: {
      description: 'a page of operations',
      schema: Joi.object({ operations: Joi.array().items(operationSchema).required(), has_more: Joi.boolean().required(), next_continuation_token: Joi.string().allow(null).required() }).label('OperationList'),
    },
    400: { description: 'a bad filter, box without project, max_results over 1000, a continuation token this api did not give' },
    404: { description: 'a project the token may not see' },
  },
  handler: async ({ api, identity, query }) => ({ body: await listOperations(api, identity, query) }),
});
