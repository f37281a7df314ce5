import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { changeBoxState } from '../../../domain/boxes';
import { acceptedResponses, boxParams, BoxParams } from './schemas';

export default defineRoute<unknown, { wait?: number }, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/stop',
  summary: 'Stop a box (SIGTERM, SIGKILL after its grace period); its files are kept',
  tag: 'boxes',
  params: boxParams,
  query: Joi.object(waitQuery),
  body: Joi.object({}).description('nothing: a field here is refused (400), not ignored'),
  responses: acceptedResponses,
  handler: async ({ api, identity, params, query }) => acceptedReply(api, await changeBoxState(api, identity, params.project, params.name, 'stop'), query.wait),
});
