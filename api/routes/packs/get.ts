import { defineRoute } from '../../http/route';
import { getPack } from '../../../domain/packs';
import { packParams, PackParams, packSchema } from './schemas';

export default defineRoute<unknown, unknown, PackParams>({
  method: 'get',
  path: '/v1/packs/{name}',
  summary: 'One pack, with its revisions',
  tag: 'packs',
  params: packParams,
  responses: { 200: { description: 'the pack', schema: packSchema }, 404: { description: 'no such pack' } },
  handler: async ({ api, params }) => ({ body: await getPack(api, params.name) }),
});
