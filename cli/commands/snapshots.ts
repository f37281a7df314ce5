import type { Command } from 'commander';
import type { Box, BoxSnapshot, BoxSnapshotList } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, Ctx, projectOption } from '../context';
import { finishJob, OperationFailed, pollOperation } from '../jobs';
import { formatBytes, formatTime, printFields, printTable, say } from '../output';
import { showBox } from './boxes';

const snapshotsPath = (ctx: Ctx, project: string | undefined, box: string) => apiPath('v1', 'projects', ctx.project(project), 'boxes', box, 'snapshots');
const snapshotPath = (ctx: Ctx, project: string | undefined, box: string, name: string) => `${snapshotsPath(ctx, project, box)}/${encodeURIComponent(name)}`;


const showSnapshot = (s: BoxSnapshot) =>
  printFields([
    ['name', s.name],
    ['created', formatTime(s.created_at)],
    ['size', formatBytes(s.size_bytes)],
    ['description', s.description],
  ]);

/** `box snapshot create|ls|get|restore|rm`: checkpoints of a box's root (docs/snapshots.md). */
export function register(program: Command): void {
  const snap = program.command('snapshot').alias('snap').description("checkpoints of a box's root: take, list, restore, delete; fork one with box create NEW --fork BOX@SNAPSHOT");

  projectOption(snap.command('create <box> <name>').description('snapshot a box (a running box is paused for the instant of it): box snapshot create web before-upgrade -d "before apt upgrade"'))
    .option('-d, --description <text>', 'one line kept with the snapshot')
    .action(
      action<{ project?: string; description?: string }>(async (ctx, [box, name], o) => {
        const r = await ctx.client.request<BoxSnapshot | Box>('POST', snapshotsPath(ctx, o.project, box), { body: { name, ...(o.description !== undefined ? { description: o.description } : {}) } });
        const taken = (s: BoxSnapshot) => ctx.show(s, () => say(`snapshot ${s.name} of box ${box} taken (${formatBytes(s.size_bytes)})`));
        if (r.status === 201) return taken(r.body as BoxSnapshot);
        // Past 30 s the api answers 202 + operation: follow it, then show the snapshot.
        const label = { doing: 'snapshotting', done: 'snapshotted', what: `box ${box}` };
        const op = await pollOperation(ctx, String(r.headers['operation-id']), label);
        if (op.status === 'failed') throw new OperationFailed(op, label);
        taken((await ctx.client.request<BoxSnapshot>('GET', snapshotPath(ctx, o.project, box, name))).body);
      }),
    );

  projectOption(snap.command('ls <box>').alias('list').description("a box's snapshots, oldest first")).action(
    action<{ project?: string }>(async (ctx, [box], o) => {
      const r = await ctx.client.request<BoxSnapshotList>('GET', snapshotsPath(ctx, o.project, box));
      ctx.show(r.body, (l) => printTable(['NAME', 'CREATED', 'SIZE', 'DESCRIPTION'], l.snapshots.map((s) => [s.name, formatTime(s.created_at), formatBytes(s.size_bytes), s.description ?? '']), `box ${box} has no snapshots`));
    }),
  );

  projectOption(snap.command('get <box> <name>').description('one snapshot of a box')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      ctx.show((await ctx.client.request<BoxSnapshot>('GET', snapshotPath(ctx, o.project, box, name))).body, showSnapshot);
    }),
  );

  projectOption(snap.command('restore <box> <name>').description("bring a box back to a snapshot: it stops, gets the snapshot's files and runs again"))
    .option('--wait', 'wait for the restore to finish, showing progress')
    .action(
      action<{ project?: string; wait?: boolean }>(async (ctx, [box, name], o) => {
        const r = await ctx.client.request<Box>('POST', `${snapshotPath(ctx, o.project, box, name)}/restore`);
        await finishJob(ctx, r, { doing: 'restoring', done: 'restored', what: `box ${box} to ${name}` }, Boolean(o.wait), showBox);
      }),
    );

  projectOption(snap.command('rm <box> <name>').alias('delete').description('delete a snapshot (boxes forked from it keep working)')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      await ctx.client.request('DELETE', snapshotPath(ctx, o.project, box, name));
      if (!ctx.json) say(`deleted snapshot ${name} of box ${box}`);
    }),
  );
}
