import type { Command } from 'commander';
import type { Webhook } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, list } from '../context';
import { formatList, formatTime, printTable, say } from '../output';

/** `box webhook add|ls|rm` (docs/packs.md "Webhooks"). */
export function register(program: Command): void {
  const hooks = program.command('webhook').description('URLs that get each event (verb runs, box lifecycle) as a signed POST');

  hooks
    .command('add <url>')
    .description('register a webhook: box webhook add https://ci.example.com/boxhost --project shop --kind box')
    .option('--project <project>', 'whose events (a token without a project limit may leave it out: every project)')
    .option('--kind <kind>', 'verb, box (every box kind) or box.created, …; repeatable or comma-separated; all by default', list)
    .option('--secret <secret>', 'the signing secret (at least 16 characters); generated when left out')
    .action(action<{ project?: string; kind?: string[]; secret?: string }>(async (ctx, [url], o) => {
      const { body } = await ctx.client.post<Webhook>('/v1/webhooks', { url, project: o.project, kinds: o.kind, secret: o.secret });
      ctx.show(body, (w) => {
        say(`registered webhook ${w.id} for ${w.project ? `project ${w.project}` : 'every project'} (kinds: ${formatList(w.kinds) || 'all'})`);
        say('');
        say('Signing secret (shown only this once; check Boxhost-Signature with it, see docs/packs.md):');
        say('');
        say(`    ${w.secret}`);
        say('');
      });
    }));

  hooks
    .command('ls')
    .description('list webhooks and how their latest delivery went')
    .action(action(async (ctx) => {
      const { body } = await ctx.client.get<{ webhooks: Webhook[] }>('/v1/webhooks');
      ctx.show(body, ({ webhooks }) => printTable(
        ['ID', 'URL', 'PROJECT', 'KINDS', 'LAST', 'STATUS', 'ERROR'],
        webhooks.map((w) => [w.id, w.url, w.project ?? '(all)', formatList(w.kinds) || '(all)', formatTime(w.last_attempt_at) || 'never', w.last_status ?? '', w.last_error ?? '']),
        'no webhooks',
      ));
    }));

  hooks
    .command('rm <id>')
    .description('remove a webhook')
    .action(action(async (ctx, [id]) => {
      await ctx.client.delete(apiPath('v1', 'webhooks', id));
      ctx.show({ deleted: id }, () => say(`webhook ${id} removed`));
    }));
}
