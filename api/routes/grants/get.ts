import { defineRoute } from '../../http/route';
import { getGrant } from '../../../domain/grants';
import { grantParams, grantSchema } from './schemas';

export default defineRoute<unknown, unknown, { name: string }>({
  method: 'get',
  path: '/v1/repohost/grants/{name}',
  summary: 'Get a repository-host grant',
  tag: 'grants',
  access: 'admin',
  params: grantParams,
  responses: { 200: { description: 'the grant', schema: grantSchema }, 404: { description: 'no such grant' } },
  handler: async ({ api, params }) => ({ body: await getGrant(api.db, params.name) }),
});
