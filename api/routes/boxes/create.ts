import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { envMap, name, tagMap } from '../../http/schemas';
import { acceptedReply, waitQuery } from '../../http/operation';
import type { CreateBoxRequest } from '../../../domain/boxes';
import { createBoxOrInstance } from '../../../domain/instances';
import { acceptedResponses, configSchema, mountPath, projectParams } from './schemas';

export default defineRoute<CreateBoxRequest, { wait?: number }, { project: string }>({
  method: 'post',
  path: '/v1/projects/{project}/boxes',
  summary: 'Create a box from a base, or fork one (`fork: "box"` or `"box@snapshot"`)',
  tag: 'boxes',
  params: projectParams,
  query: Joi.object(waitQuery),
  body: Joi.object({
    name: name().required(),
    base: Joi.string().pattern(/^[a-z0-9-]+(@[a-z0-9.-]+)?$/).allow(null),
    config: configSchema.allow(null),
    data_mounts: Joi.array().items(Joi.object({ name: name().required(), path: mountPath().required(), read_only: Joi.boolean().default(false) })).allow(null),
    env_from: Joi.array().items(Joi.object({ alias: Joi.string().pattern(/^[A-Za-z][A-Za-z0-9_]*$/).max(32).required(), box: name().required() })).max(16).allow(null),
    environment: envMap().allow(null),
    fork: Joi.string().pattern(/^[a-z0-9-]+(@[a-z0-9-]+)?$/).allow(null),
    lifecycle: Joi.string().allow(null),
    pack: name().allow(null),
    tags: tagMap().allow(null),
  }),
  responses: { ...acceptedResponses, 404: { description: 'a project this token cannot reach (as if it did not exist)' }, 409: { description: "the name is taken, no node has room, the project's network on the node has no free address, or no network is left for a new project" } },
  handler: async ({ api, identity, params, body, query }) => acceptedReply(api, await createBoxOrInstance(api, identity, params.project, body), query.wait),
});
