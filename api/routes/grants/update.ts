import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { updateGrant, GrantInput } from '../../../domain/grants';
import { grantParams, grantSchema, permissions, repositories } from './schemas';

export default defineRoute<Partial<GrantInput>, unknown, { name: string }>({
  method: 'put',
  path: '/v1/repohost/grants/{name}',
  summary: 'Update a repository-host grant (fields given replace the stored ones)',
  tag: 'grants',
  access: 'admin',
  params: grantParams,
  // `name` may be sent back as it is (the whole record); it must equal the path's.
  body: Joi.object({ name: name(), permissions: permissions(), repositories: repositories() }).min(1),
  responses: { 200: { description: 'the grant', schema: grantSchema }, 404: { description: 'no such grant' } },
  handler: async ({ api, params, body }) => ({ body: await updateGrant(api.db, params.name, body) }),
});
