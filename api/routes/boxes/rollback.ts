import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { rollbackInstance } from '../../../domain/deploys';
import { acceptedResponses, boxParams, BoxParams } from './schemas';

export default defineRoute<unknown, { wait?: number }, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/rollback',
  summary: "Roll a deployed line back to the generation its live box names in rollback_to (docs/packs.md \"Deploy generations\"): resumed, its services ready-gated, the publishes switched back; the generation it replaces is stopped after the drain time",
  tag: 'packs',
  params: boxParams,
  query: Joi.object(waitQuery),
  body: Joi.object({}),
  responses: {
    ...acceptedResponses,
    202: { ...acceptedResponses[202], description: 'accepted: the generation the line goes back to, with the operation of the rollback' },
    403: { description: 'a project token without the deploy scope' },
    409: { description: 'never deployed, no earlier generation left, or a deploy of the line under way' },
  },
  handler: async ({ api, identity, params, query }) => acceptedReply(api, await rollbackInstance(api, identity, params.project, params.name), query.wait),
});
