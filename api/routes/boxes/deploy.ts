import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { acceptedReply, waitQuery } from '../../http/operation';
import { deployInstance } from '../../../domain/deploys';
import { acceptedResponses, boxParams, BoxParams } from './schemas';

export default defineRoute<{ rev?: string }, { wait?: number }, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/deploy',
  summary: "Deploy a new generation of a pack instance's line (docs/packs.md \"Deploy generations\"): a box `<line>-g<N>` at the revision asked for, its services ready-gated, then the line's publishes switched to it; the generation it replaces keeps serving for the drain time and is then stopped, kept for a rollback. Admin tokens, or tokens with the deploy scope",
  tag: 'packs',
  params: boxParams,
  query: Joi.object(waitQuery),
  body: Joi.object({
    rev: Joi.string().max(128).description("a revision label of the pack's manifest, or a revision hash; the default revision when left out"),
  }),
  responses: {
    ...acceptedResponses,
    202: { ...acceptedResponses[202], description: 'accepted: the new generation, with the operation of the deploy (its services ready and the publishes switched)' },
    400: { description: 'no such revision of the pack' },
    403: { description: 'a project token without the deploy scope' },
    409: { description: 'not a pack instance, a dev instance, one with data volumes, or a deploy of the line under way' },
  },
  handler: async ({ api, identity, params, body, query }) => acceptedReply(api, await deployInstance(api, identity, params.project, params.name, body), query.wait),
});
