import { defineRoute } from '../../http/route';
import { deleteGrant } from '../../../domain/grants';
import { grantParams } from './schemas';

export default defineRoute<unknown, unknown, { name: string }>({
  method: 'delete',
  path: '/v1/repohost/grants/{name}',
  summary: 'Delete a repository-host grant',
  tag: 'grants',
  access: 'admin',
  params: grantParams,
  responses: { 204: { description: 'deleted' }, 404: { description: 'no such grant' } },
  handler: async ({ api, params }) => {
    await deleteGrant(api.db, params.name);
    return { status: 204 };
  },
});
