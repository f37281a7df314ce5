import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { deleteToken } from '../../../domain/tokens';

export default defineRoute<unknown, unknown, { id: string }>({
  method: 'delete',
  path: '/v1/tokens/{id}',
  summary: 'Revoke an API token',
  tag: 'tokens',
  access: 'admin',
  params: Joi.object({ id: Joi.string().max(64).required() }),
  responses: { 204: { description: 'revoked' }, 404: { description: 'no such token' }, 409: { description: 'the bootstrap token' } },
  handler: async ({ api, params }) => {
    await deleteToken(api.db, params.id);
    return { status: 204 };
  },
});
