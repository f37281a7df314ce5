import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { untilClientGone } from '../../http/clientGone';
import { execResultSchema } from './exec';
import { envMap, name, projectParam } from '../../http/schemas';
import { runVerb } from '../../../domain/verbs';
import type { RunVerbRequest } from '../../../core/apiTypes';

type VerbParams = { project: string; name: string; verb: string };

export default defineRoute<RunVerbRequest, unknown, VerbParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/verbs/{verb}',
  summary: "Run a verb of a pack instance (its pinned revision's command plus args, with the variables the verb declares); records one event",
  tag: 'packs',
  params: Joi.object({ project: projectParam.required(), name: name().required(), verb: name().required() }),
  body: Joi.object({
    args: Joi.array().items(Joi.string().allow('').max(65536)).max(4096),
    env: envMap(),
  }),
  responses: {
    200: {
      description: 'the exec result and the id of the event it recorded',
      schema: execResultSchema.keys({ event_id: Joi.string().required() }).label('VerbResult'),
    },
    400: { description: 'a variable the verb does not declare (details name each)' },
    404: { description: 'no such box, or no such verb in its pack revision' },
    409: { description: 'the box is not a pack instance, or not running (the event of the failed run is named)' },
    429: { description: 'too many concurrent execs (see Retry-After)' },
  },
  handler: async ({ api, identity, params, body, res }) =>
    // As exec: a client that goes away takes its command with it.
    ({ body: await untilClientGone(res, (signal) => runVerb(api, identity, params.project, params.name, params.verb, body, { slots: api.limits.execSlots, signal })) }),
});
