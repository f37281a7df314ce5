import { defineRoute } from '../../http/route';
import { getBase } from '../../../domain/bases';
import { baseErrors, baseParams, BaseParams, baseSchema } from './schemas';

export default defineRoute<unknown, unknown, BaseParams>({
  method: 'get',
  path: '/v1/bases/{name}',
  summary: 'One base: `name` is its newest version, `name@version` a pinned one',
  tag: 'bases',
  params: baseParams,
  responses: { 200: { description: 'the base', schema: baseSchema }, ...baseErrors },
  handler: async ({ api, identity, params }) => ({ body: await getBase(api, identity, params.name) }),
});
