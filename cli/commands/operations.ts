import type { Command } from 'commander';
import { apiPath, UsageError } from '../client';
import { action, int } from '../context';
import type { Operation, OperationList } from '../../core/apiTypes';
import { formatTime, note, printFields, printTable } from '../output';

export const showOperation = (op: Operation) =>
  printFields([
    ['id', op.id],
    ['kind', op.kind],
    ['status', op.status],
    ['progress', op.progress === null ? null : `${op.progress}%`],
    ['error', op.error],
    ['resource', op.resource],
    ['created', formatTime(op.created_at)],
    ['updated', formatTime(op.updated_at)],
  ]);

export function register(program: Command): void {
  const ops = program.command('op').alias('operation').description('long operations (box create, stop, resume, delete, …)');

  ops
    .command('ls')
    .alias('list')
    .description('list operations, newest first (GET /v1/operations): what is queued or running, and what finished lately')
    .option('-p, --project <project>', 'only this project (default: every project the token sees)')
    .option('--box <box>', 'only operations on this box (with -p, else $BOXHOST_PROJECT or "default")')
    .option('--status <status,...>', 'only these statuses: queued, running, succeeded, failed (comma-separated)')
    .option('--pending', 'only what is still to happen (--status queued,running)')
    .option('--kind <kind>', 'only this kind (box.create, box.stop, data.backup, …)')
    .option('--max-results <n>', 'page size (default 100, at most 1000)', int(0, 1000))
    .option('--continuation-token <token>', 'the next page, as told by the previous one')
    .action(
      action<{ project?: string; box?: string; status?: string; pending?: boolean; kind?: string; maxResults?: number; continuationToken?: string }>(async (ctx, _args, o) => {
        if (o.pending && o.status) throw new UsageError('give --status or --pending, not both');
        const project = o.project ?? (o.box ? ctx.project(undefined) : undefined);
        const { body } = await ctx.client.get<OperationList>(apiPath('v1', 'operations'), {
          query: { project, box: o.box, status: o.pending ? 'queued,running' : o.status, kind: o.kind, max_results: o.maxResults, continuation_token: o.continuationToken },
        });
        ctx.show(body, ({ operations }) =>
          printTable(
            ['ID', 'KIND', 'STATUS', 'PROGRESS', 'RESOURCE', 'CREATED', 'ERROR'],
            operations.map((op) => [op.id, op.kind, op.status, op.progress === null ? '' : `${op.progress}%`, op.resource, formatTime(op.created_at), op.error ?? '']),
            'no operations',
          ),
        );
        if (body.has_more && body.next_continuation_token) note(`more operations: add --continuation-token ${body.next_continuation_token}`);
      }),
    );

  ops
    .command('get <id>')
    .description('show an operation (GET /v1/operations/{id})')
    .action(
      action(async (ctx, [id]) => {
        const { body } = await ctx.client.get<Operation>(apiPath('v1', 'operations', id));
        ctx.show(body, showOperation);
      }),
    );

  ops
    .command('wait <id>')
    .description('wait for an operation to finish (GET /v1/operations/{id}/wait); exits 1 when it failed or is still running at the timeout')
    .option('--timeout <seconds>', 'give up after this many seconds (at most 300; server default 30)', int(0, 300))
    .action(
      action<{ timeout?: number }>(async (ctx, [id], o) => {
        const { body } = await ctx.client.get<Operation>(`${apiPath('v1', 'operations', id)}/wait`, { query: { timeout: o.timeout } });
        ctx.show(body, showOperation);
        if (body.status === 'failed') ctx.exit(1);
      }),
    );
}
