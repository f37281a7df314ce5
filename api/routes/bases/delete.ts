import { defineRoute } from '../../http/route';
import { deleteBase } from '../../../domain/bases';
import { baseErrors, baseParams, BaseParams } from './schemas';

export default defineRoute<unknown, unknown, BaseParams>({
  method: 'delete',
  path: '/v1/bases/{name}',
  summary: 'Delete one version (`name@version`) or every version (`name`) of a base',
  tag: 'bases',
  params: baseParams,
  responses: {
    204: { description: 'deleted' },
    403: { description: 'an imported base (every project uses it) and a token limited to projects' },
    409: { description: 'a box was made from it (in any project), it is still being made, or it is built in' },
    ...baseErrors,
  },
  handler: async ({ api, identity, params }) => {
    await deleteBase(api, identity, params.name);
    return { status: 204 };
  },
});
