import { defineRoute } from '../../http/route';
import { getAuthSettings } from '../../../domain/authSettings';
import { authSettingsResponse } from './schemas';

export default defineRoute({
  method: 'get',
  path: '/v1/auth/settings',
  summary: 'Which identity-provider accounts may sign in',
  tag: 'auth',
  access: 'admin',
  responses: { 200: { description: 'settings', schema: authSettingsResponse } },
  handler: async ({ api }) => ({ body: await getAuthSettings(api.db, api.config) }),
});
