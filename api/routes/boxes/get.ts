import { defineRoute } from '../../http/route';
import { getBox } from '../../../domain/boxes';
import { boxParams, BoxParams, boxSchema } from './schemas';

export default defineRoute<unknown, unknown, BoxParams>({
  method: 'get',
  path: '/v1/projects/{project}/boxes/{name}',
  summary: 'Get a box',
  tag: 'boxes',
  params: boxParams,
  responses: { 200: { description: 'the box', schema: boxSchema }, 404: { description: 'no such box' } },
  handler: async ({ api, identity, params }) => ({ body: await getBox(api, identity, params.project, params.name) }),
});
