import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { AuthSettingsUpdate, updateAuthSettings } from '../../../domain/authSettings';
import { authSettingsResponse } from './schemas';

/** Domains and emails are stored lowercased (a body's other values are never converted). */
const domain = Joi.string().hostname().lowercase().prefs({ convert: true });

export default defineRoute<AuthSettingsUpdate>({
  method: 'put',
  path: '/v1/auth/settings',
  summary: 'Update auth settings (null or absent fields stay as they are)',
  tag: 'auth',
  access: 'admin',
  body: Joi.object({
    allow_all_idp_accounts: Joi.boolean().allow(null),
    allowed_domains: Joi.array().items(domain).unique().allow(null),
    allowed_emails: Joi.array().items(Joi.string().email({ tlds: false }).lowercase().prefs({ convert: true })).unique().allow(null),
    protect_system_domains: Joi.boolean().allow(null),
  }),
  responses: { 200: { description: 'the settings now in force', schema: authSettingsResponse } },
  handler: async ({ api, body }) => ({ body: await updateAuthSettings(api.db, api.config, body) }),
});
