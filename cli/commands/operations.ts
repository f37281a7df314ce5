import type { Command } from 'commander';
import { apiPath } from '../client';
import { action, int } from '../context';
import type { Operation } from '../jobs';
import { formatTime, printFields } from '../output';

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
