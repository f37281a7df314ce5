import type { Command } from 'commander';
import type { Node } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, Ctx } from '../context';
import { formatTime, printFields, printTable, say } from '../output';

const gb = (mb: number) => `${(mb / 1024).toFixed(1)} GiB`;

const showNode = (n: Node) =>
  printFields([
    ['id', n.id],
    ['name', n.name],
    ['region', n.region],
    ['state', n.state],
    ['status', n.status],
    ['reason', n.reason ?? undefined],
    ['storage', n.storage],
    ['storage restarts', n.storage_restarts ? `${n.storage_restarts} (last ${formatTime(n.storage_restarted_at)})` : '0'],
    ['agent', n.agent_url ?? '(in-process only)'],
    ['version', n.version],
    ['cpus', `${n.committed.cpus} of ${n.capacity.cpus} committed`],
    ['ram', `${gb(n.committed.ram_mb)} of ${gb(n.capacity.ram_mb)} committed`],
    ['disk', `${n.committed.disk_gb} of ${n.capacity.disk_gb} GB committed`],
    ['boxes', n.committed.boxes],
    ['started', formatTime(n.started_at)],
    ['heartbeat', formatTime(n.heartbeat_at) || 'none (stopped)'],
  ]);

async function setState(ctx: Ctx, id: string, state: Node['state']) {
  const { body } = await ctx.client.put<Node>(apiPath('v1', 'nodes', id), { state });
  ctx.show(body, (n) => say(state === 'draining' ? `node ${n.id} is draining: it keeps its ${n.committed.boxes} boxes, new ones go elsewhere` : `node ${n.id} is active: it takes new boxes`));
}

export function register(program: Command): void {
  const nodes = program.command('node').description('nodes: the machines that hold boxes (admin token)');

  nodes
    .command('ls')
    .description('list nodes with their health and what is committed on them (GET /v1/nodes)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ nodes: Node[] }>('/v1/nodes');
        ctx.show(body, ({ nodes: list }) =>
          printTable(
            // DISK: promised of what may be (capacity × overcommit): storage is what a small
            // host runs out of first, and creates past it answer 507.
            ['ID', 'REGION', 'STATE', 'STATUS', 'BOXES', 'CPUS', 'RAM', 'DISK', 'HEARTBEAT'],
            list.map((n) => [
              n.id,
              n.region,
              n.state,
              n.status,
              n.committed.boxes,
              `${n.committed.cpus}/${n.capacity.cpus}`,
              `${gb(n.committed.ram_mb)}/${gb(n.capacity.ram_mb)}`,
              `${n.committed.disk_gb}/${n.allocatable.disk_gb} GB`,
              formatTime(n.heartbeat_at) || 'stopped',
            ]),
            'no nodes have registered',
          ),
        );
      }),
    );

  nodes
    .command('get <id>')
    .description('show one node (GET /v1/nodes/{id})')
    .action(action(async (ctx, [id]) => ctx.show((await ctx.client.get<Node>(apiPath('v1', 'nodes', id))).body, showNode)));

  nodes
    .command('drain <id>')
    .description('send no new boxes to a node; its boxes stay (PUT /v1/nodes/{id} state=draining)')
    .action(action(async (ctx, [id]) => setState(ctx, id, 'draining')));

  nodes
    .command('undrain <id>')
    .description('let a drained node take new boxes again (PUT /v1/nodes/{id} state=active)')
    .action(action(async (ctx, [id]) => setState(ctx, id, 'active')));

  nodes
    .command('rm <id>')
    .description('forget a node that is down and holds no boxes (DELETE /v1/nodes/{id})')
    .option('--force', 'the node is gone for good: forget it with its boxes (they are marked failed, to be deleted)')
    .action(
      action<{ force?: boolean }>(async (ctx, [id], opts) => {
        await ctx.client.delete(apiPath('v1', 'nodes', id), { query: { force: opts.force ? true : undefined } });
        if (!ctx.json) say(opts.force ? `forgot node ${id}; its boxes are failed and can be deleted` : `forgot node ${id}`);
      }),
    );
}
