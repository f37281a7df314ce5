import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name, projectParam } from '../../http/schemas';
import { waitQuery } from '../../http/operation';
import { baseReply } from './reply';
import { saveBase } from '../../../domain/bases';
import type { SaveBaseRequest } from '../../../core/apiTypes';
import { acceptedBaseResponses, provenanceFields } from './schemas';

export default defineRoute<SaveBaseRequest, { wait?: number }, { project: string }>({
  method: 'post',
  path: '/v1/projects/{project}/bases',
  summary: "Save a box's root as a new base version (a running box is paused for the instant its root is held)",
  tag: 'bases',
  params: Joi.object({ project: projectParam.required() }),
  query: Joi.object(waitQuery),
  body: Joi.object({ box: name().required(), name: name().required(), ...provenanceFields }),
  responses: {
    ...acceptedBaseResponses,
    404: { description: 'no such box' },
    409: { description: 'the box is not running or stopped; the name belongs to another project, an imported or a built-in base; this version exists' },
    429: { description: "the project's storage quota has no GB free (Retry-After)" },
    503: { description: "the box's node is not answering" },
    507: { description: "the box's node has no GB of storage left to promise" },
  },
  handler: async ({ api, identity, params, body, query }) => baseReply(api, await saveBase(api, identity, params.project, body), query.wait, 'save'),
});
