import type { Command } from 'commander';
import type { Ticket, Token } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, int, list } from '../context';
import { formatList, formatTime, printTable, say } from '../output';


export function register(program: Command): void {
  program
    .command('ticket')
    .description('a single-use ticket for one WebSocket handshake within 30 s (POST /v1/tickets): for a browser, which cannot send the token as a header')
    .addHelpText('after', '\nExample: wscat -s boxhost.v1.channel -c "$BOXHOST_URL/v1/projects/demo/boxes/web/console?ticket=$(box ticket)" (ws://… for http)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.post<Ticket>('/v1/tickets', {});
        ctx.show(body, (t) => say(t.ticket));
      }),
    );

  const tokens = program.command('token').description('API tokens');

  tokens
    .command('create <name>')
    .description('create an API token (POST /v1/tokens); the secret is shown once, only here')
    .option('--project <project>', 'limit the token to this project (repeatable, or comma-separated)', list)
    .option('--expires-in <seconds>', 'expire the token after this many seconds', int(1))
    .option('--scope <scope>', 'deploy: may deploy and roll back instances of its projects (repeatable, or comma-separated)', list)
    .action(
      action<{ project?: string[]; expiresIn?: number; scope?: string[] }>(async (ctx, [name], opts) => {
        const { body } = await ctx.client.post<Token>('/v1/tokens', { name, projects: opts.project, expires_in: opts.expiresIn, scopes: opts.scope });
        ctx.show(body, (t) => {
          say(`created token ${t.name} (id ${t.id}, projects: ${formatList(t.projects) || 'all'}, expires: ${formatTime(t.expires_at) || 'never'}${t.scopes ? `, scopes: ${t.scopes.join(',')}` : ''})`);
          say('');
          say('Secret (shown only this once, store it now):');
          say('');
          say(`    ${t.token}`);
          say('');
        });
      }),
    );

  tokens
    .command('ls')
    .description('list API tokens, never their secrets (GET /v1/tokens)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ tokens: Token[] }>('/v1/tokens');
        ctx.show(body, ({ tokens }) =>
          printTable(
            ['ID', 'NAME', 'PROJECTS', 'CREATED', 'EXPIRES', 'LAST USED'],
            tokens.map((t) => [t.id, t.name, formatList(t.projects) || '(all)', formatTime(t.created_at), formatTime(t.expires_at) || 'never', formatTime(t.last_used_at) || 'never']),
            'no tokens (besides the bootstrap admin token)',
          ),
        );
      }),
    );

  tokens
    .command('rm <id>')
    .description('revoke an API token (DELETE /v1/tokens/{id})')
    .action(
      action(async (ctx, [id]) => {
        await ctx.client.delete(apiPath('v1', 'tokens', id));
        if (!ctx.json) say(`revoked token ${id}`);
      }),
    );
}
