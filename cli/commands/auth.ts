import type { Command } from 'commander';
import type { AuthSettingsResponse } from '../../core/apiTypes';
import { UsageError } from '../client';
import { action, bool, defined, list } from '../context';
import { formatList, printFields } from '../output';

function showSettings(s: AuthSettingsResponse): void {
  printFields([
    ['configured', s.configured],
    ['allow all idp accounts', s.settings.allow_all_idp_accounts],
    ['allowed domains', formatList(s.settings.allowed_domains)],
    ['allowed emails', formatList(s.settings.allowed_emails)],
    ['protect system domains', s.settings.protect_system_domains],
    ['auth url', s.auth_url],
    ['auth redirect uri', s.auth_redirect_uri],
    ['idp auth client url', s.idp_auth_client_url],
    ['cookie domain', s.cookie_domain],
  ]);
}

interface SetOptions {
  allowAllIdpAccounts?: boolean;
  allowedDomain?: string[];
  allowedEmail?: string[];
  clearAllowedDomains?: boolean;
  clearAllowedEmails?: boolean;
  protectSystemDomains?: boolean;
}

export function register(program: Command): void {
  const settings = program.command('auth').description('sign-in settings').command('settings').description('which identity-provider accounts may sign in');

  settings
    .command('get')
    .description('show the auth settings (GET /v1/auth/settings)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<AuthSettingsResponse>('/v1/auth/settings');
        ctx.show(body, showSettings);
      }),
    );

  settings
    .command('set')
    .description('change the auth settings (PUT /v1/auth/settings); only the flags given are sent, the rest stays as it is')
    .option('--allow-all-idp-accounts <bool>', 'let every account of the identity provider sign in (true|false)', bool)
    .option('--allowed-domain <domain>', 'allowed email domain; the list given replaces the stored one (repeatable)', list)
    .option('--clear-allowed-domains', 'set the allowed domains to none')
    .option('--allowed-email <email>', 'allowed email address; the list given replaces the stored one (repeatable)', list)
    .option('--clear-allowed-emails', 'set the allowed emails to none')
    .option('--protect-system-domains <bool>', 'protect the system domains (true|false)', bool)
    .action(
      action<SetOptions>(async (ctx, _args, o) => {
        if (o.allowedDomain && o.clearAllowedDomains) throw new UsageError('give --allowed-domain or --clear-allowed-domains, not both');
        if (o.allowedEmail && o.clearAllowedEmails) throw new UsageError('give --allowed-email or --clear-allowed-emails, not both');
        const body = defined({
          allow_all_idp_accounts: o.allowAllIdpAccounts,
          allowed_domains: o.clearAllowedDomains ? [] : o.allowedDomain,
          allowed_emails: o.clearAllowedEmails ? [] : o.allowedEmail,
          protect_system_domains: o.protectSystemDomains,
        });
        if (!body) throw new UsageError('nothing to set: give at least one option (see box auth settings set --help)');
        const res = await ctx.client.put<AuthSettingsResponse>('/v1/auth/settings', body);
        ctx.show(res.body, showSettings);
      }),
    );
}
