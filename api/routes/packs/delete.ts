import { defineRoute } from '../../http/route';
import { deletePack } from '../../../domain/packs';
import { packParams, PackParams } from './schemas';

export default defineRoute<unknown, unknown, PackParams>({
  method: 'delete',
  path: '/v1/packs/{name}',
  summary: 'Delete a pack (refused while boxes are instances of it)',
  tag: 'packs',
  params: packParams,
  responses: {
    204: { description: 'deleted' },
    403: { description: 'a token limited to projects' },
    404: { description: 'no such pack' },
    409: { description: 'boxes are instances of it (named by count)' },
  },
  handler: async ({ api, identity, params }) => {
    await deletePack(api, identity, params.name);
    return { status: 204 };
  },
});
