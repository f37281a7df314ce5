import type { Command } from 'commander';
import type { Box, BoxList } from '../../core/apiTypes';
import { MAX_STOP_GRACE_SECS } from '../../core/box';
import { apiPath, ApiResponse, UsageError } from '../client';
import { action, Ctx, defined, int, keyValue, list, projectOption } from '../context';
import { finishJob, JobLabel } from '../jobs';
import { formatMap, formatTime, note, printFields, printTable } from '../output';

export type { Box };

export const showBox = (b: Box) =>
  printFields([
    ['name', b.name],
    ['project', b.project],
    ['status', b.status],
    ['error', b.error ?? undefined],
    ['base', b.base],
    ['fork of', b.fork ?? undefined],
    ['address', b.address],
    ['node', b.node],
    ['cpus', b.config?.cpus],
    ['ram', b.config?.ram_mb !== undefined ? `${b.config.ram_mb} MB` : undefined],
    ['storage', b.config?.storage_gb !== undefined ? `${b.config.storage_gb} GB` : undefined],
    ['region', b.config?.region],
    ['tags', formatMap(b.tags)],
    ['environment', formatMap(b.environment)],
    ['data', b.data_mounts?.length ? b.data_mounts.map((m) => `${m.name} at ${m.path}${m.read_only ? ' (read-only)' : ''}`).join(', ') : undefined],
    ['published', b.publishes?.length ? b.publishes.map((p) => `${p.url} → port ${p.port}${p.public ? '' : ' (private)'}`).join(', ') : undefined],
    ['grace period', b.termination_grace_period_seconds != null ? `${b.termination_grace_period_seconds}s` : undefined],
    ['id', b.id],
    ['created', formatTime(b.created_at)],
    ['updated', formatTime(b.updated_at)],
  ]);

const boxesPath = (project: string) => apiPath('v1', 'projects', project, 'boxes');
const boxPath = (project: string, name: string) => apiPath('v1', 'projects', project, 'boxes', name);

interface JobOptions {
  project?: string;
  wait?: boolean;
}

/** The shape of every job-backed box command: one call answering 202 + operation, then finishJob. */
async function boxJob(ctx: Ctx, o: JobOptions, name: string, verbs: [doing: string, done: string], call: (project: string) => Promise<ApiResponse<Box>>) {
  const project = ctx.project(o.project);
  const label: JobLabel = { doing: verbs[0], done: verbs[1], what: `box ${name}` };
  await finishJob(ctx, await call(project), label, Boolean(o.wait), showBox);
}

const waitHelp = 'wait for the operation to finish, showing progress; exits 1 if it fails (with --json, prints the finished operation)';

/** A simple job-backed state change: `box stop|resume|rm NAME`. */
function stateCommand(parent: Command, spec: { name: string; description: string; verbs: [string, string]; call: (ctx: Ctx, project: string, name: string) => Promise<ApiResponse<Box>> }) {
  projectOption(parent.command(`${spec.name} <name>`).description(spec.description))
    .option('--wait', waitHelp)
    .action(action<JobOptions>((ctx, [name], o) => boxJob(ctx, o, name, spec.verbs, (project) => spec.call(ctx, project, name))));
}

interface CreateOptions extends JobOptions {
  base?: string;
  fork?: string;
  cpus?: number;
  ramMb?: number;
  storageGb?: number;
  region?: string;
  env?: Record<string, string>;
  tag?: Record<string, string>;
  data?: { name: string; path: string; read_only: boolean }[];
  pack?: string;
  dev?: boolean;
  envFrom?: Record<string, string>;
}

/** `--data NAME:/path[:ro]` (repeatable). */
function dataMount(value: string, previous: CreateOptions['data']): NonNullable<CreateOptions['data']> {
  const m = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(value);
  if (!m) throw new UsageError(`--data takes NAME:/path or NAME:/path:ro, not ${JSON.stringify(value)}`);
  return [...(previous ?? []), { name: m[1], path: m[2], read_only: m[3] === 'ro' }];
}

interface ListOptions {
  project?: string;
  allProjects?: boolean;
  prefix?: string;
  tag?: string[];
  maxResults?: number;
  continuationToken?: string;
}

interface UpdateOptions {
  project?: string;
  cpus?: number;
  ramMb?: number;
  tag?: Record<string, string>;
  clearTags?: boolean;
  gracePeriod?: number;
}

export function register(program: Command): void {
  projectOption(program.command('create <name>').description('create a box (POST /v1/projects/{project}/boxes); answers at once unless --wait'))
    .option('--base <base>', 'base to make it from, name or name@version (server default: busybox)')
    .option('--fork <box[@snapshot]>', 'clone another box of the project (or one of its snapshots) instead of a base')
    .option('--cpus <n>', 'CPU limit', int(1))
    .option('--ram-mb <n>', 'memory limit in MB (at least 64)', int(64))
    .option('--storage-gb <n>', 'root filesystem quota in GB', int(1))
    .option('--region <region>', 'region: the box goes to a node of it (default: the api\'s BOXHOST_REGION)')
    .option('--env <KEY=VALUE>', 'environment variable of the box (repeatable)', keyValue)
    .option('--tag <KEY=VALUE>', 'tag (repeatable)', keyValue)
    .option('--data <NAME:/path[:ro]>', 'mount data volume NAME at /path (repeatable; :ro read-only)', dataMount)
    .option('--pack <pack>', 'make it an instance of this installed pack (its base; box verb runs its verbs)')
    .option('--dev', 'with --pack: lifecycle dev')
    .option('--env-from <ALIAS=BOX>', "another instance's outputs as ALIAS_KEY variables (repeatable)", keyValue)
    .option('--wait', waitHelp)
    .action(
      action<CreateOptions>((ctx, [name], o) =>
        boxJob(ctx, o, name, o.fork ? ['forking', 'forked'] : ['creating', 'created'], (project) =>
          ctx.client.post<Box>(boxesPath(project), {
            name,
            base: o.base,
            fork: o.fork,
            config: defined({ cpus: o.cpus, ram_mb: o.ramMb, storage_gb: o.storageGb, region: o.region }),
            environment: o.env,
            tags: o.tag,
            ...(o.data ? { data_mounts: o.data } : {}),
            ...(o.pack ? { pack: o.pack } : {}),
            ...(o.dev ? { lifecycle: 'dev' } : {}),
            ...(o.envFrom ? { env_from: Object.entries(o.envFrom).map(([alias, box]) => ({ alias, box })) } : {}),
          }),
        ),
      ),
    );

  projectOption(program.command('fork <source> <newname>').description('fork a box: SOURCE or SOURCE@SNAPSHOT into NEWNAME in the same project (POST /v1/projects/{project}/boxes with fork)'))
    .option('--wait', waitHelp)
    .action(
      action<JobOptions>((ctx, [source, newName], o) =>
        boxJob(ctx, o, newName, ['forking', 'forked'], (project) => ctx.client.post<Box>(boxesPath(project), { name: newName, fork: source })),
      ),
    );

  projectOption(program.command('ls').description('list boxes (GET /v1/projects/{project}/boxes)'))
    .option('-A, --all-projects', 'boxes of every project the token sees (project "-")')
    .option('--prefix <prefix>', 'only names starting with this')
    .option('--tag <key[=value],...>', 'only boxes with every one of these tags (repeatable, or comma-separated)', list)
    .option('--max-results <n>', 'page size (default 100, at most 1000)', int(0, 1000))
    .option('--continuation-token <token>', 'the next page, as told by the previous one')
    .action(
      action<ListOptions>(async (ctx, _args, o) => {
        if (o.allProjects && o.project) throw new UsageError('give -p/--project or --all-projects, not both');
        const project = o.allProjects ? '-' : ctx.project(o.project);
        const { body } = await ctx.client.get<BoxList>(boxesPath(project), {
          query: { prefix: o.prefix, tag: o.tag?.join(','), max_results: o.maxResults, continuation_token: o.continuationToken },
        });
        ctx.show(body, ({ boxes }) =>
          printTable(
            ['NAME', 'PROJECT', 'STATUS', 'BASE', 'ADDRESS', 'CREATED'],
            boxes.map((b) => [b.name, b.project, b.status, b.base, b.address, formatTime(b.created_at)]),
            project === '-' ? 'no boxes' : `no boxes in project ${project}`,
          ),
        );
        if (body.has_more && body.next_continuation_token) note(`more boxes: add --continuation-token ${body.next_continuation_token}`);
      }),
    );

  projectOption(program.command('get <name>').description('show a box (GET /v1/projects/{project}/boxes/{name})')).action(
    action<{ project?: string }>(async (ctx, [name], o) => {
      const { body } = await ctx.client.get<Box>(boxPath(ctx.project(o.project), name));
      ctx.show(body, showBox);
    }),
  );

  projectOption(
    program
      .command('update <name>')
      .description('change a running box (PUT /v1/projects/{project}/boxes/{name}): cpus and memory live, tags, grace period; only the flags given are sent'),
  )
    .option('--cpus <n>', 'CPU limit', int(1))
    .option('--ram-mb <n>', 'memory limit in MB (at least 64)', int(64))
    .option('--tag <KEY=VALUE>', 'tag (repeatable); the tags given REPLACE the whole tag map, so list every tag to keep', keyValue)
    .option('--clear-tags', 'remove every tag')
    .option('--grace-period <seconds>', `termination grace period: how long stop waits after SIGTERM before SIGKILL (at most ${MAX_STOP_GRACE_SECS})`, int(0, MAX_STOP_GRACE_SECS))
    .action(
      action<UpdateOptions>(async (ctx, [name], o) => {
        if (o.tag && o.clearTags) throw new UsageError('give --tag or --clear-tags, not both');
        const body = defined({
          config: defined({ cpus: o.cpus, ram_mb: o.ramMb }),
          tags: o.clearTags ? {} : o.tag,
          termination_grace_period_seconds: o.gracePeriod,
        });
        if (!body) throw new UsageError('nothing to update: give --cpus, --ram-mb, --tag, --clear-tags or --grace-period');
        const res = await ctx.client.put<Box>(boxPath(ctx.project(o.project), name), body);
        ctx.show(res.body, showBox);
      }),
    );

  stateCommand(program, {
    name: 'stop',
    description: 'stop a box; its files are kept (POST /v1/projects/{project}/boxes/{name}/stop)',
    verbs: ['stopping', 'stopped'],
    call: (ctx, project, name) => ctx.client.post<Box>(`${boxPath(project, name)}/stop`),
  });
  stateCommand(program, {
    name: 'resume',
    description: 'start a stopped or failed box again (POST /v1/projects/{project}/boxes/{name}/resume)',
    verbs: ['resuming', 'resumed'],
    call: (ctx, project, name) => ctx.client.post<Box>(`${boxPath(project, name)}/resume`),
  });
  stateCommand(program, {
    name: 'rm',
    description: 'delete a box (DELETE /v1/projects/{project}/boxes/{name})',
    verbs: ['deleting', 'deleted'],
    call: (ctx, project, name) => ctx.client.delete<Box>(boxPath(project, name)),
  });
}
