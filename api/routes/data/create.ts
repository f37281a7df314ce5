import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name, projectParam } from '../../http/schemas';
import { operationHeaders } from '../../http/operation';
import { createVolume } from '../../../domain/volumes';
import type { CreateDataVolumeRequest } from '../../../core/apiTypes';
import { volumeSchema } from './schemas';

export default defineRoute<CreateDataVolumeRequest>({
  method: 'post',
  path: '/v1/data',
  summary: 'Create a data volume (its quota from size_gb, BOXHOST_DATA_DEFAULT_GB when absent); answers it once made, or 202 + operation past 30 s',
  tag: 'data',
  body: Joi.object({
    name: name().required(),
    size_gb: Joi.number().integer().min(1).max(16384),
    description: Joi.string().allow('', null).max(1024),
    project: projectParam.allow(null).description('the project whose boxes it attaches to; default: a project-limited token\'s first, else none until its first attach'),
  }),
  responses: {
    201: { description: 'made', schema: volumeSchema },
    202: { description: 'still being made after 30 s: poll Location or GET /v1/operations/{Operation-Id}', schema: volumeSchema },
    400: { description: 'a bad name or size' },
    404: { description: 'a project this token cannot reach (as if it did not exist)' },
    409: { description: 'the name is taken' },
    429: { description: "the project's volumes or storage quota is used up" },
    507: { description: 'no node has room for its quota' },
  },
  handler: async ({ api, identity, body }) => {
    const made = await createVolume(api, identity, body);
    if ('done' in made) return { status: 201, body: made.done, headers: { Location: `/v1/data/${body.name}` } };
    return { status: 202, body: (await made.accepted.load()) ?? undefined, headers: operationHeaders(made.accepted.operation) };
  },
});
