import type { Config } from '../core/config';
import type { Db } from '../db/knex';
import { settingsRepo } from '../db/repos/settings';

export interface AuthSettings {
  allow_all_idp_accounts: boolean;
  allowed_domains: string[];
  allowed_emails: string[];
  protect_system_domains: boolean;
}

/** PUT body: null or absent leaves a field as it was. */
export type AuthSettingsUpdate = { [K in keyof AuthSettings]?: AuthSettings[K] | null };

const KEY = 'auth_settings';

export const DEFAULT_AUTH_SETTINGS: AuthSettings = {
  allow_all_idp_accounts: false,
  allowed_domains: [],
  allowed_emails: [],
  protect_system_domains: false,
};

/** DESIGN.md §6: an identity provider is configured when issuer, client id and secret are set. */
export const idpConfigured = (config: Config) => Boolean(config.oidc.issuer && config.oidc.clientId && config.oidc.clientSecret);

function describe(config: Config, settings: AuthSettings) {
  const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${config.port}`;
  return {
    auth_redirect_uri: `${base}/auth/callback`,
    auth_url: `${base}/auth/login`,
    configured: idpConfigured(config),
    idp_auth_client_url: config.oidc.issuer ?? '',
    cookie_domain: config.publishDomain,
    cloud_project: null,
    workspace_domain: config.publishDomain,
    settings,
  };
}

export async function getAuthSettings(db: Db, config: Config) {
  const stored = await settingsRepo.get<AuthSettings>(db, KEY);
  return describe(config, { ...DEFAULT_AUTH_SETTINGS, ...stored });
}

export async function updateAuthSettings(db: Db, config: Config, update: AuthSettingsUpdate) {
  return db.transaction(async (trx) => {
    const current = { ...DEFAULT_AUTH_SETTINGS, ...(await settingsRepo.get<AuthSettings>(trx, KEY)) };
    const next = { ...current };
    for (const key of Object.keys(DEFAULT_AUTH_SETTINGS) as (keyof AuthSettings)[]) {
      const v = update[key];
      if (v !== null && v !== undefined) (next as any)[key] = v;
    }
    await settingsRepo.put(trx, KEY, next);
    return describe(config, next);
  });
}
