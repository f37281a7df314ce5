import { defineRoute } from '../../http/route';
import { getVolume } from '../../../domain/volumes';
import { volumeErrors, volumeParams, VolumeParams, volumeSchema } from './schemas';

export default defineRoute<unknown, unknown, VolumeParams>({
  method: 'get',
  path: '/v1/data/{name}',
  summary: 'Get a data volume',
  tag: 'data',
  params: volumeParams,
  responses: { 200: { description: 'the volume', schema: volumeSchema }, ...volumeErrors },
  handler: async ({ api, identity, params }) => ({ status: 200, body: await getVolume(api, identity, params.name) }),
});
