import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { changeBoxState } from '../../../domain/boxes';
import { acceptedResponses, boxParams, BoxParams } from './schemas';

export default defineRoute<unknown, { wait?: number }, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/resume',
  summary: 'Start a stopped box again',
  tag: 'boxes',
  params: boxParams,
  query: Joi.object(waitQuery),
  body: Joi.object({}).description('nothing: a field here is refused (400), not ignored'),
  responses: acceptedResponses,
  handler: async ({ api, identity, params, query }) => acceptedReply(api, await changeBoxState(api, identity, params.project, params.name, 'resume'), query.wait),
});
