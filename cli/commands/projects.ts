import type { Command } from 'commander';
import type { Project, ProjectQuotas } from '../../core/apiTypes';
import { apiPath, UsageError } from '../client';
import { action, int } from '../context';
import { formatTime, printFields, printTable } from '../output';

const QUOTA_KEYS: (keyof ProjectQuotas)[] = ['boxes', 'cpus', 'ram_mb', 'storage_gb', 'volumes'];

const showProject = (p: Project) =>
  printFields([
    ['name', p.name],
    ['created', formatTime(p.created_at)],
    ...QUOTA_KEYS.map((k): [string, string] => [k.replace('_', ' '), `${p.usage[k]} of ${p.quotas[k]}`]),
  ]);

interface QuotaOptions {
  boxes?: number;
  cpus?: number;
  ramMb?: number;
  storageGb?: number;
  volumes?: number;
  reset?: string[];
}

export function register(program: Command): void {
  const project = program.command('project').description('projects (made by their first box), their quotas and usage');

  project
    .command('ls')
    .description('list projects (GET /v1/projects)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ projects: Project[] }>('/v1/projects');
        ctx.show(body, ({ projects }) =>
          printTable(
            ['NAME', 'BOXES', 'CPUS', 'RAM MB', 'STORAGE GB', 'CREATED'],
            projects.map((p) => [p.name, `${p.usage.boxes}/${p.quotas.boxes}`, `${p.usage.cpus}/${p.quotas.cpus}`, `${p.usage.ram_mb}/${p.quotas.ram_mb}`, `${p.usage.storage_gb}/${p.quotas.storage_gb}`, formatTime(p.created_at)]),
            'no projects yet (a project is made by its first box)',
          ),
        );
      }),
    );

  project
    .command('get <name>')
    .description("show a project's usage against its quotas (GET /v1/projects/{project})")
    .action(action(async (ctx, [name]) => ctx.show((await ctx.client.get<Project>(apiPath('v1', 'projects', name))).body, showProject)));

  project
    .command('quota <name>')
    .description("set a project's quotas; the others stay (PUT /v1/projects/{project}, admin token)")
    .option('--boxes <n>', 'boxes at most', int(0))
    .option('--cpus <n>', 'cpus of all its boxes together', int(0))
    .option('--ram-mb <n>', 'RAM of all its boxes together, in MB', int(0))
    .option('--storage-gb <n>', 'storage of all its boxes together, in GB', int(0))
    .option('--volumes <n>', 'data volumes at most', int(0))
    .option('--reset <key>', 'back to the host default (repeatable): boxes, cpus, ram_mb, storage_gb, volumes', (v: string, acc: string[] = []) => [...acc, v])
    .action(
      action<QuotaOptions>(async (ctx, [name], o) => {
        const quotas: Partial<Record<keyof ProjectQuotas, number | null>> = {};
        if (o.boxes !== undefined) quotas.boxes = o.boxes;
        if (o.cpus !== undefined) quotas.cpus = o.cpus;
        if (o.ramMb !== undefined) quotas.ram_mb = o.ramMb;
        if (o.storageGb !== undefined) quotas.storage_gb = o.storageGb;
        if (o.volumes !== undefined) quotas.volumes = o.volumes;
        for (const k of o.reset ?? []) {
          if (!QUOTA_KEYS.includes(k as keyof ProjectQuotas)) throw new UsageError(`--reset takes one of ${QUOTA_KEYS.join(', ')}, not ${k}`);
          quotas[k as keyof ProjectQuotas] = null;
        }
        if (Object.keys(quotas).length === 0) throw new UsageError('give at least one quota to set or --reset');
        ctx.show((await ctx.client.put<Project>(apiPath('v1', 'projects', name), { quotas })).body, showProject);
      }),
    );
}
