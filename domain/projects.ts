import type { DomainContext, Identity } from './context';
import { projectsRepo } from '../db/repos/projects';
import type { Project } from '../core/apiTypes';
import { canSeeProject } from './access';

/** Projects the caller may see, with their box counts. */
export async function listProjects(ctx: DomainContext, identity: Identity): Promise<Project[]> {
  const counts = await projectsRepo.boxCounts(ctx.db);
  return (await projectsRepo.list(ctx.db))
    .filter((p) => canSeeProject(identity, p.name))
    .map((p) => ({ name: p.name, created_at: p.created_at, box_count: counts.get(p.name) ?? 0 }));
}
