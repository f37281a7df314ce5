import type { Command } from 'commander';
import type { Grant } from '../../core/apiTypes';
import { apiPath, UsageError } from '../client';
import { action, defined, keyValue, list } from '../context';
import { formatList, formatMap, formatTime, printFields, printTable, say } from '../output';

const showGrant = (g: Grant) =>
  printFields([
    ['name', g.name],
    ['permissions', formatMap(g.permissions)],
    ['repositories', formatList(g.repositories)],
    ['created', formatTime(g.created_at)],
    ['updated', formatTime(g.updated_at)],
  ]);

interface GrantOptions {
  permission?: Record<string, string>;
  repo?: string[];
}

const permissionHelp = 'permission as NAME=read|write, e.g. contents=read (repeatable)';
const repoHelp = 'repository as owner/name (repeatable, or comma-separated)';

export function register(program: Command): void {
  const grants = program.command('grant').description('repository-host grants');
  const grantPath = (name: string) => apiPath('v1', 'repohost', 'grants', name);

  grants
    .command('create <name>')
    .description('create a grant (POST /v1/repohost/grants)')
    .requiredOption('--permission <name=level>', permissionHelp, keyValue)
    .requiredOption('--repo <owner/name>', repoHelp, list)
    .action(
      action<GrantOptions>(async (ctx, [name], o) => {
        const { body } = await ctx.client.post<Grant>('/v1/repohost/grants', { name, permissions: o.permission, repositories: o.repo });
        ctx.show(body, showGrant);
      }),
    );

  grants
    .command('ls')
    .description('list grants (GET /v1/repohost/grants)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ grants: Grant[] }>('/v1/repohost/grants');
        ctx.show(body, ({ grants: list }) =>
          printTable(
            ['NAME', 'PERMISSIONS', 'REPOSITORIES', 'UPDATED'],
            list.map((g) => [g.name, formatMap(g.permissions), formatList(g.repositories), formatTime(g.updated_at)]),
            'no grants',
          ),
        );
      }),
    );

  grants
    .command('get <name>')
    .description('show a grant (GET /v1/repohost/grants/{name})')
    .action(
      action(async (ctx, [name]) => {
        const { body } = await ctx.client.get<Grant>(grantPath(name));
        ctx.show(body, showGrant);
      }),
    );

  grants
    .command('update <name>')
    .description('update a grant (PUT /v1/repohost/grants/{name}); --permission and --repo each replace the whole stored set')
    .option('--permission <name=level>', permissionHelp, keyValue)
    .option('--repo <owner/name>', repoHelp, list)
    .action(
      action<GrantOptions>(async (ctx, [name], o) => {
        const body = defined({ permissions: o.permission, repositories: o.repo });
        if (!body) throw new UsageError('nothing to update: give --permission and/or --repo');
        const res = await ctx.client.put<Grant>(grantPath(name), body);
        ctx.show(res.body, showGrant);
      }),
    );

  grants
    .command('rm <name>')
    .description('delete a grant (DELETE /v1/repohost/grants/{name})')
    .action(
      action(async (ctx, [name]) => {
        await ctx.client.delete(grantPath(name));
        if (!ctx.json) say(`deleted grant ${name}`);
      }),
    );
}
