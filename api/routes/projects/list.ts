import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { projectsRepo } from '../../../db/repos/projects';
import { canSeeProject } from '../../services/access';

export default defineRoute({
  method: 'get',
  path: '/v1/projects',
  summary: 'List projects (made by their first box)',
  tag: 'projects',
  responses: {
    200: { description: 'projects', schema: Joi.object({ projects: Joi.array().items(Joi.object({ name: Joi.string(), created_at: Joi.string(), box_count: Joi.number() })) }) },
  },
  handler: async ({ api, identity }) => {
    const counts = await projectsRepo.boxCounts(api.db);
    const projects = (await projectsRepo.list(api.db))
      .filter((p) => canSeeProject(identity, p.name))
      .map((p) => ({ name: p.name, created_at: p.created_at, box_count: counts.get(p.name) ?? 0 }));
    return { body: { projects } };
  },
});
