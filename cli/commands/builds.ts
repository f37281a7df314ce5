import fs from 'node:fs';
import type { Command } from 'commander';
import type { Base, BaseBuild, BaseBuildStart } from '../../core/apiTypes';
import { UsageError } from '../client';
import { action, Ctx } from '../context';
import { OperationFailed, pollOperation } from '../jobs';
import { formatBytes, formatTime, printFields, say } from '../output';

const showBuild = (b: BaseBuild) =>
  printFields([
    ['id', b.id],
    ['status', b.status],
    ['base', `${b.base}@${b.version}`],
    ['parent', b.parent],
    ['cached', b.cached ? 'yes' : 'no'],
    ['project', b.project],
    ['box', b.box],
    ['exit code', b.exit_code],
    ['error', b.error],
    ['created', formatTime(b.created_at)],
  ]);

interface StartOptions {
  parent?: string;
  script?: string;
  scriptFile?: string;
  force?: boolean;
  project?: string;
  global?: boolean;
  wait?: boolean;
  follow?: boolean;
}

/** Starts a build (POST /v1/base-builds); with --follow its log is printed as it runs, with
 *  --wait (or --follow) the command ends when the build does. */
async function start(ctx: Ctx, base: string, o: StartOptions): Promise<void> {
  if (!o.parent) throw new UsageError('--parent is required (a base name or name@version)');
  if ((o.script === undefined) === (o.scriptFile === undefined)) throw new UsageError('give the script with --script or --script-file (one of them)');
  const script = o.script ?? fs.readFileSync(o.scriptFile === '-' ? 0 : o.scriptFile!, 'utf8');
  // -p, else $BOXHOST_PROJECT (as every box command), else none: a base of every project.
  if (o.global && o.project) throw new UsageError('give -p or --global, not both');
  const project = o.global ? undefined : o.project || process.env.BOXHOST_PROJECT || undefined;
  const r = await ctx.client.request<BaseBuildStart>('POST', '/v1/base-builds', { body: { base, parent: o.parent, script, force: Boolean(o.force), ...(project ? { project } : {}) } });
  const started = r.body as BaseBuildStart;
  const opId = String(r.headers['operation-id']);
  if (started.cached) return ctx.show(started, () => say(`base ${base}@${started.version} exists already (cached build ${started.id}); --force builds it again`));
  if (o.follow) {
    const res = await ctx.client.stream('GET', `/v1/base-builds/${started.id}/logs`, { follow: 'true' });
    for await (const c of res) process.stderr.write(c as Buffer);
  }
  if (!o.wait && !o.follow) {
    return ctx.show(started, () => {
      say(`build ${started.id} of ${base}@${started.version}: ${started.status}`);
      say(`follow it with: box build logs ${started.id} -f`);
    });
  }
  const label = { doing: 'building', done: 'built', what: `base ${base}@${started.version}` };
  const op = await pollOperation(ctx, opId, label);
  const build = (await ctx.client.get<BaseBuild>(`/v1/base-builds/${started.id}`)).body;
  if (op.status === 'failed') throw new OperationFailed({ ...op, error: build.error ?? op.error }, label);
  ctx.show(build, showBuild);
}

const startFlags = (cmd: Command) =>
  cmd
    .option('--parent <base>', 'the base it starts from (name or name@version)')
    .option('--script <text>', 'the script, run as root with /bin/sh -c')
    .option('--script-file <file>', 'the script from a file (- for stdin)')
    .option('--force', 'build again even if that version exists')
    .option('-p, --project <project>', 'where the temporary box runs and whose base it becomes (default: $BOXHOST_PROJECT)')
    .option('--global', "a base of every project, whatever $BOXHOST_PROJECT says (a token without a project limit)")
    .option('--wait', 'wait for the build to end, showing progress')
    .option('-f, --follow', 'print its log as it runs, and wait for the end');

/** `box build start|status|logs` and `box base build` (docs/bases.md "Builds"). */
export function register(program: Command): void {
  const build = program.command('build').description('server-side base builds: a script run in a temporary box, saved as a base');
  startFlags(build.command('start <base>').description('build BASE: box build start tools --parent busybox --script "echo hi > /etc/motd" -f'))
    .action(action<StartOptions>((ctx, [base], o) => start(ctx, base, o)));
  build.command('status <id>').alias('get').description('one build').action(
    action(async (ctx, [id]) => ctx.show((await ctx.client.get<BaseBuild>(`/v1/base-builds/${encodeURIComponent(id)}`)).body, showBuild)),
  );
  build.command('logs <id>').description("a build's output").option('-f, --follow', 'keep printing until the build ends').action(
    action<{ follow?: boolean }>(async (_ctx, [id], o) => {
      const res = await _ctx.client.stream('GET', `/v1/base-builds/${encodeURIComponent(id)}/logs`, { follow: o.follow ? 'true' : undefined });
      process.once('SIGINT', () => res.destroy());
      for await (const c of res) process.stdout.write(c as Buffer);
    }),
  );
}

/**
 * `box base build debian`: a built-in recipe base made on a node now (POST /v1/bases/NAME/build),
 * waiting with progress unless --no-wait.
 */
async function buildRecipe(ctx: Ctx, name: string, o: StartOptions & { node?: string }): Promise<void> {
  const r = await ctx.client.request<Base>('POST', `/v1/bases/${encodeURIComponent(name)}/build`, { body: o.node ? { node: o.node } : {} });
  const answered = r.body as Base;
  const opId = String(r.headers['operation-id']);
  if (o.wait === false) {
    return ctx.show(answered, () => {
      say(`making base ${name}@${answered.version}: accepted`);
      say(`operation: ${opId} (follow it with: box op wait ${opId})`);
    });
  }
  const label = { doing: 'making', done: 'made', what: `base ${name}@${answered.version}` };
  const op = await pollOperation(ctx, opId, label);
  if (op.status === 'failed') throw new OperationFailed(op, label);
  const base = (await ctx.client.get<Base>(`/v1/bases/${encodeURIComponent(name)}@${answered.version}`)).body;
  ctx.show(base, (b) => say(`base ${b.name}@${b.version} is ready (${formatBytes(b.size_bytes)})`));
}

/** `box base build NAME …`: with --parent and a script the same as `box build start`; without
 *  them NAME is a built-in recipe base (`debian`) made on a node now. */
export function registerUnderBase(base: Command): void {
  startFlags(base.command('build <name>').description('build a base from a parent and a script (= box build start); without them, make a built-in recipe base now: box base build debian'))
    .option('--node <node>', 'recipe bases: the node to make it on')
    .option('--no-wait', 'recipe bases: answer at once instead of waiting')
    .action(action<StartOptions & { node?: string }>((ctx, [name], o) => (o.parent === undefined && o.script === undefined && o.scriptFile === undefined ? buildRecipe(ctx, name, o) : start(ctx, name, o))));
}
