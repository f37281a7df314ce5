import type { Command } from 'commander';
import type { Project } from '../../core/apiTypes';
import { action } from '../context';
import { formatTime, printTable } from '../output';

export function register(program: Command): void {
  program
    .command('project')
    .description('projects (made by their first box)')
    .command('ls')
    .description('list projects (GET /v1/projects)')
    .action(
      action(async (ctx) => {
        const { body } = await ctx.client.get<{ projects: Project[] }>('/v1/projects');
        ctx.show(body, ({ projects }) =>
          printTable(['NAME', 'BOXES', 'CREATED'], projects.map((p) => [p.name, p.box_count, formatTime(p.created_at)]), 'no projects yet (a project is made by its first box)'),
        );
      }),
    );
}
