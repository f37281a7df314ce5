import type { Command } from 'commander';
import type { Webhook } from '../../core/apiTypes';
import { apiPath, UsageError } from '../client';
import { action, list } from '../context';
import { formatList, formatTime, printTable, say } from '../output';

/** `box webhook add|ls|rm` (docs/packs.md "Webhooks"). */
export function register(program: Command): void {
  const hooks = program.command('webhook').description('URLs that get each event (verb runs, box lifecycle) as a signed POST');

  hooks
    .command('add <url>')
    .description('register a webhook: box webhook add https://ci.example.com/boxhost --project shop --kind box')
    .option('-p, --project <project>', 'whose events (default: the current project)')
    .option('--all-projects', "every project's events (tokens without a project limit)")
    .option('--kind <kind>', 'verb, box (every box kind) or box.created, …; repeatable or comma-separated; all by default', list)
    .option('--secret <secret>', 'the signing secret (at least 16 characters); generated when left out')
    .action(action<{ project?: string; allProjects?: boolean; kind?: string[]; secret?: string }>(async (ctx, [url], o) => {
      if (o.allProjects && o.project) throw new UsageError('give --project or --all-projects, not both');
      const project = o.allProjects ? null : ctx.project(o.project);
      const { body } = await ctx.client.post<Webhook>('/v1/webhooks', { url, project, kinds: o.kind, secret: o.secret });
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
        webhooks.map((w) => [w.id, w.url, w.project ?? '(all)', formatList(w.kinds) || '(all)', formatTime(w.last_attempt_at) || 'never', w.last_status ?? '',
          w.disabled_at ? `disabled after ${w.failures} failed deliveries` : (w.last_error ?? '')]),
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
