import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { waitQuery } from '../../http/operation';
import { baseReply } from './reply';
import { toApiBase } from '../../../domain/bases';
import { buildRecipeBase, type RecipeBuildRequest } from '../../../domain/recipeBases';
import { acceptedBaseResponses } from './schemas';

export default defineRoute<RecipeBuildRequest, { wait?: number }, { name: string }>({
  method: 'post',
  path: '/v1/bases/{name}/build',
  summary: 'Make a built-in recipe base (`debian`) on a node now, ahead of the first box from it (docs/bases.md "The debian base")',
  tag: 'bases',
  params: Joi.object({ name: name().required() }),
  query: Joi.object(waitQuery),
  body: Joi.object({ node: name().description('the node to make it on; default: where the next box would go') }),
  responses: {
    ...acceptedBaseResponses,
    404: { description: 'no recipe base of that name, or no such node' },
    503: { description: 'the node is not answering' },
  },
  handler: async ({ api, identity, params, body, query }) => baseReply(api, await buildRecipeBase(api, identity, params.name, body ?? {}, toApiBase), query.wait, 'build'),
});
