import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { createToken, CreateTokenRequest } from '../../../domain/tokens';
import { tokenSchema } from './schemas';

export default defineRoute<CreateTokenRequest>({
  method: 'post',
  path: '/v1/tokens',
  summary: 'Create an API token (the secret is shown only in this answer)',
  tag: 'tokens',
  access: 'admin',
  body: Joi.object({
    name: name().required(),
    projects: Joi.array().items(name()).min(1).unique().allow(null),
    expires_in: Joi.number().integer().min(1).max(10 * 365 * 24 * 3600).allow(null).description('seconds'),
    scopes: Joi.array().items(Joi.string().valid('deploy')).unique().description('deploy: may deploy and roll back instances of its projects (docs/packs.md)'),
  }),
  responses: { 201: { description: 'created', schema: tokenSchema.keys({ token: Joi.string().required() }) } },
  handler: async ({ api, body, identity }) => ({ status: 201, body: await createToken(api.db, identity, body) }),
});
