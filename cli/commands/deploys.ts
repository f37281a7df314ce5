import type { Command } from 'commander';
import type { Box } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, projectOption } from '../context';
import { finishJob } from '../jobs';
import { showBox } from './boxes';

const waitHelp = 'wait until the line serves from the generation (its services ready, publishes switched), showing progress; exits 1 if it fails';

/** `box deploy`, `box rollback` (docs/packs.md "Deploy generations"). */
export function register(program: Command): void {
  projectOption(program.command('deploy <box>').description("deploy a new generation of a pack instance's line (the pack's default revision, or --rev): box deploy web --rev v2 --wait"))
    .option('--rev <rev>', "a revision label of the pack's manifest, or a revision hash")
    .option('--wait', waitHelp)
    .action(action<{ project?: string; rev?: string; wait?: boolean }>(async (ctx, [box], o) => {
      const res = await ctx.client.post<Box>(apiPath('v1', 'projects', ctx.project(o.project), 'boxes', box, 'deploy'), o.rev ? { rev: o.rev } : {});
      await finishJob(ctx, res, { doing: 'deploying', done: 'deployed', what: `a new generation of ${box} (${res.body.name})` }, Boolean(o.wait), showBox);
    }));

  projectOption(program.command('rollback <box>').description("switch a deployed line back to the generation before the live one: box rollback web --wait"))
    .option('--wait', waitHelp)
    .action(action<{ project?: string; wait?: boolean }>(async (ctx, [box], o) => {
      const res = await ctx.client.post<Box>(apiPath('v1', 'projects', ctx.project(o.project), 'boxes', box, 'rollback'), {});
      await finishJob(ctx, res, { doing: 'rolling back to', done: 'rolled back to', what: res.body.name }, Boolean(o.wait), showBox);
    }));
}
