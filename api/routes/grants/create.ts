import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { createGrant, GrantInput } from '../../../domain/grants';
import { grantSchema, permissions, repositories } from './schemas';

export default defineRoute<GrantInput>({
  method: 'post',
  path: '/v1/repohost/grants',
  summary: 'Create a repository-host grant',
  tag: 'grants',
  access: 'admin',
  body: Joi.object({ name: name().required(), permissions: permissions().required(), repositories: repositories().required() }),
  responses: { 201: { description: 'created', schema: grantSchema }, 409: { description: 'name taken' } },
  handler: async ({ api, body }) => ({ status: 201, body: await createGrant(api.db, body) }),
});
