import Joi from 'joi';

const settings = Joi.object({
  allow_all_idp_accounts: Joi.boolean().required(),
  allowed_domains: Joi.array().items(Joi.string()).required(),
  allowed_emails: Joi.array().items(Joi.string()).required(),
  protect_system_domains: Joi.boolean().required(),
}).label('AuthSettings');

export const authSettingsResponse = Joi.object({
  auth_redirect_uri: Joi.string().required(),
  auth_url: Joi.string().required(),
  configured: Joi.boolean().required(),
  idp_auth_client_url: Joi.string().allow('').required(),
  settings: settings.required(),
  cookie_domain: Joi.string(),
  cloud_project: Joi.string().allow(null),
  workspace_domain: Joi.string().allow(null),
}).label('AuthSettingsResponse');
