import type { Command } from 'commander';
import type { Box, DataBackup, DataSnapshot, DataVolume, Operation } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, Ctx, int, projectOption } from '../context';
import { OperationFailed, pollOperation } from '../jobs';
import { formatBytes, formatTime, printFields, printTable, say } from '../output';
import { showBox } from './boxes';

const volPath = (name: string, ...rest: string[]) => apiPath('v1', 'data', name, ...rest);

const showVolume = (v: DataVolume) =>
  printFields([
    ['name', v.name],
    ['project', v.project ?? '(none yet: its first attach decides)'],
    ['node', v.node],
    ['size', `${formatBytes(v.size_bytes)} of ${v.quota_gb} GB`],
    ['description', v.description],
    ['created', formatTime(v.created_at)],
    ['attached', v.attachments.map((a) => `${a.project}/${a.box}:${a.path}${a.read_only ? ' (ro)' : ''}`).join(', ') || '-'],
  ]);

const showBackup = (b: DataBackup) =>
  printFields([
    ['name', b.name],
    ['status', b.status],
    ['mode', b.mode],
    ['parent', b.parent],
    ['size', b.size_bytes === null ? null : formatBytes(b.size_bytes)],
    ['sha256', b.sha256],
    ['description', b.description],
    ['error', b.error],
    ['created', formatTime(b.created_at)],
  ]);

/** A 201-or-202 answer: the record, or (past the api's 30 s) the operation followed to its end. */
async function madeOr<T>(ctx: Ctx, r: { status: number; body: unknown; headers: Record<string, string | string[] | undefined> }, label: { doing: string; done: string; what: string }, reread: () => Promise<T>): Promise<T> {
  if (r.status === 201 || r.status === 200 || r.status === 204) return r.body as T;
  const op = await pollOperation(ctx, String(r.headers['operation-id']), label);
  if (op.status === 'failed') throw new OperationFailed(op, label);
  return reread();
}

/** Follows a backup or restore operation (progress on stderr) when asked to. */
async function follow(ctx: Ctx, opId: string | undefined, label: { doing: string; done: string; what: string }, wait: boolean): Promise<Operation | null> {
  if (!wait || !opId) {
    if (opId && !ctx.json) say(`operation: ${opId} (follow it with: box op wait ${opId})`);
    return null;
  }
  const op = await pollOperation(ctx, opId, label);
  if (op.status === 'failed') throw new OperationFailed(op, label);
  return op;
}

/** `box data …`: data volumes, their snapshots and backups (docs/data.md). */
export function register(program: Command): void {
  const data = program.command('data').description('data volumes: create, attach to boxes, snapshot, back up, restore');

  data.command('create <name>').description('create a data volume: box data create pgdata --size-gb 20')
    .option('--size-gb <n>', 'its quota in GB (snapshots count; server default 10)', int(1))
    .option('-d, --description <text>', 'what it holds')
    .option('-p, --project <project>', 'the project whose boxes may attach it (default: the first box it is attached to)')
    .action(
      action<{ sizeGb?: number; description?: string; project?: string }>(async (ctx, [name], o) => {
        const r = await ctx.client.request<DataVolume>('POST', '/v1/data', { body: { name, size_gb: o.sizeGb, description: o.description, project: o.project } });
        const v = await madeOr(ctx, r, { doing: 'creating', done: 'created', what: `data volume ${name}` }, async () => (await ctx.client.get<DataVolume>(volPath(name))).body);
        ctx.show(v, (x) => say(`created data volume ${x.name} (${x.quota_gb} GB on node ${x.node})`));
      }),
    );

  data.command('ls').alias('list').description('data volumes').action(
    action(async (ctx) => {
      const { body } = await ctx.client.get<{ volumes: DataVolume[] }>('/v1/data');
      ctx.show(body, (l) =>
        printTable(['NAME', 'PROJECT', 'SIZE', 'QUOTA', 'ATTACHED', 'CREATED'], l.volumes.map((v) => [v.name, v.project ?? '-', formatBytes(v.size_bytes), `${v.quota_gb} GB`, v.attachments.map((a) => `${a.project}/${a.box}:${a.path}`).join(',') || '-', formatTime(v.created_at)]), 'no data volumes'),
      );
    }),
  );

  data.command('get <name>').description('one data volume').action(
    action(async (ctx, [name]) => ctx.show((await ctx.client.get<DataVolume>(volPath(name))).body, showVolume)),
  );

  data.command('rm <name>').alias('delete').description('delete a data volume with its snapshots and backups (detach it first)').action(
    action(async (ctx, [name]) => {
      const r = await ctx.client.request('DELETE', volPath(name));
      if (r.status === 202) await follow(ctx, String(r.headers['operation-id']), { doing: 'deleting', done: 'deleted', what: `data volume ${name}` }, true);
      if (!ctx.json) say(`deleted data volume ${name}`);
    }),
  );

  projectOption(data.command('attach <name> <box> <path>').description('attach a volume to a box at PATH; it is mounted at the box\'s next start (box stop BOX && box resume BOX)'))
    .option('--read-only', 'mount it read-only')
    .action(
      action<{ project?: string; readOnly?: boolean }>(async (ctx, [name, box, path], o) => {
        const r = await ctx.client.post<Box>(volPath(name, 'attach'), { project: ctx.project(o.project), box, path, read_only: Boolean(o.readOnly) });
        ctx.show(r.body, (b) => {
          showBox(b);
          if (b.status === 'running') say(`note: box ${box} runs; ${name} is mounted at ${path} from its next start`);
        });
      }),
    );

  projectOption(data.command('detach <name> <box>').description('detach a volume from a box (a running box keeps it until it stops)')).action(
    action<{ project?: string }>(async (ctx, [name, box], o) => {
      const r = await ctx.client.post<Box>(volPath(name, 'detach'), { project: ctx.project(o.project), box });
      ctx.show(r.body, showBox);
    }),
  );

  const snap = data.command('snapshot').alias('snap').description("a volume's snapshots: create, ls, rm (restore: box data restore NAME --snapshot S)");
  snap.command('create <name> <snapshot>').option('-d, --description <text>', 'one line kept with it').description('snapshot a volume').action(
    action<{ description?: string }>(async (ctx, [name, snapshot], o) => {
      const r = await ctx.client.request<DataSnapshot>('POST', volPath(name, 'snapshots'), { body: { name: snapshot, ...(o.description !== undefined ? { description: o.description } : {}) } });
      const s = await madeOr(ctx, r, { doing: 'snapshotting', done: 'snapshotted', what: `data volume ${name}` }, async () =>
        (await ctx.client.get<{ snapshots: DataSnapshot[] }>(volPath(name, 'snapshots'))).body.snapshots.find((x) => x.name === snapshot)!);
      ctx.show(s, (x) => say(`snapshot ${x.name} of data volume ${name} taken`));
    }),
  );
  snap.command('ls <name>').alias('list').description("a volume's snapshots, oldest first").action(
    action(async (ctx, [name]) => {
      const { body } = await ctx.client.get<{ snapshots: DataSnapshot[] }>(volPath(name, 'snapshots'));
      ctx.show(body, (l) => printTable(['NAME', 'CREATED', 'SIZE', 'DESCRIPTION'], l.snapshots.map((s) => [s.name, formatTime(s.created_at), formatBytes(s.size_bytes), s.description ?? '']), `data volume ${name} has no snapshots`));
    }),
  );
  snap.command('rm <name> <snapshot>').alias('delete').description('delete a snapshot of a volume').action(
    action(async (ctx, [name, snapshot]) => {
      await ctx.client.request('DELETE', volPath(name, 'snapshots', snapshot));
      if (!ctx.json) say(`deleted snapshot ${snapshot} of data volume ${name}`);
    }),
  );

  data.command('backup <name>').description('back up a volume to the backup directory (full, then incremental on the last one)')
    .option('--name <backup>', 'the backup\'s name (default: generated, b-YYYYMMDD-HHMMSS-xxxx)')
    .option('-d, --description <text>', 'what it is')
    .option('--wait', 'wait for it to complete, showing progress')
    .action(
      action<{ name?: string; description?: string; wait?: boolean }>(async (ctx, [name], o) => {
        const r = await ctx.client.request<DataBackup>('POST', volPath(name, 'backups'), { body: { name: o.name, description: o.description } });
        const b = r.body as DataBackup;
        const op = await follow(ctx, String(r.headers['operation-id']), { doing: 'backing up', done: 'backed up', what: `data volume ${name} as ${b.name}` }, Boolean(o.wait));
        const now = op ? (await ctx.client.get<DataBackup>(volPath(name, 'backups', b.name))).body : b;
        ctx.show(now, showBackup);
      }),
    );

  data.command('backups <name>').description("a volume's backups, oldest first").action(
    action(async (ctx, [name]) => {
      const { body } = await ctx.client.get<{ backups: DataBackup[] }>(volPath(name, 'backups'));
      ctx.show(body, (l) => printTable(['NAME', 'STATUS', 'MODE', 'PARENT', 'SIZE', 'CREATED'], l.backups.map((b) => [b.name, b.status, b.mode ?? '', b.parent ?? '', b.size_bytes === null ? '' : formatBytes(b.size_bytes), formatTime(b.created_at)]), `data volume ${name} has no backups`));
    }),
  );

  data.command('restore <name>').description('restore a volume to a snapshot or a backup (stop the boxes that mount it first)')
    .option('--snapshot <snapshot>', 'one of its snapshots')
    .option('--backup <backup>', 'one of its backups (checked against its sha256 first)')
    .option('--node <node>', 'with --backup: restore it on this node, which then holds the volume (detach it first; both nodes must share the backup directory)')
    .option('--wait', 'wait for it to finish, showing progress')
    .action(
      action<{ snapshot?: string; backup?: string; node?: string; wait?: boolean }>(async (ctx, [name], o) => {
        // Whatever was given goes to the api, which names what is wrong with it (both, neither, --node without --backup).
        const body = Object.fromEntries(Object.entries({ snapshot: o.snapshot, backup: o.backup, node: o.node }).filter(([, v]) => v !== undefined));
        const r = await ctx.client.request<DataVolume>('POST', volPath(name, 'restore'), { body });
        const moving = o.node !== undefined;
        const op = await follow(ctx, String(r.headers['operation-id']), { doing: moving ? `moving to node ${o.node}` : 'restoring', done: moving ? `moved to node ${o.node}` : 'restored', what: `data volume ${name}` }, Boolean(o.wait));
        ctx.show(op ? (await ctx.client.get<DataVolume>(volPath(name))).body : (r.body as DataVolume), showVolume);
      }),
    );
}
