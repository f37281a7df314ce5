import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { updateGrant, GrantInput } from '../../../domain/grants';
import { grantParams, grantSchema, permissions, repositories } from './schemas';

export default defineRoute<Partial<Omit<GrantInput, 'name'>>, unknown, { name: string }>({
  method: 'put',
  path: '/v1/repohost/grants/{name}',
  summary: 'Update a repository-host grant (fields given replace the stored ones)',
  tag: 'grants',
  access: 'admin',
  params: grantParams,
  body: Joi.object({ permissions: permissions(), repositories: repositories() }).min(1),
  responses: { 200: { description: 'the grant', schema: grantSchema }, 404: { description: 'no such grant' } },
  handler: async ({ api, params, body }) => ({ body: await updateGrant(api.db, params.name, body) }),
});
