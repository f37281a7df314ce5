import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { detachVolume } from '../../../domain/volumes';
import type { DetachDataRequest } from '../../../core/apiTypes';
import { boxSchema } from '../boxes/schemas';
import { projectBox, volumeParams, VolumeParams } from './schemas';

export default defineRoute<DetachDataRequest, unknown, VolumeParams>({
  method: 'post',
  path: '/v1/data/{name}/detach',
  summary: 'Detach a data volume from a box; a running box keeps it mounted until its next stop',
  tag: 'data',
  params: volumeParams,
  body: Joi.object(projectBox),
  responses: {
    200: { description: 'the box without the volume', schema: boxSchema },
    404: { description: 'no such volume or box' },
    409: { description: 'the volume is not attached to that box' },
  },
  handler: async ({ api, identity, params, body }) => ({ status: 200, body: await detachVolume(api, identity, params.name, body) }),
});
