import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { changeBoxState } from '../../../domain/boxes';
import { acceptedResponses, boxParams, BoxParams } from './schemas';

export default defineRoute<unknown, { wait?: number }, BoxParams>({
  method: 'delete',
  path: '/v1/projects/{project}/boxes/{name}',
  summary: 'Delete a box: container, network, datasets (forks made from it keep working)',
  tag: 'boxes',
  params: boxParams,
  query: Joi.object(waitQuery),
  responses: { ...acceptedResponses, 204: { description: 'deleted within ?wait' } },
  handler: async ({ api, identity, params, query }) => acceptedReply(api, await changeBoxState(api, identity, params.project, params.name, 'delete'), query.wait),
});
