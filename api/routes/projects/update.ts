import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { setProjectQuotas } from '../../../domain/projects';
import type { ProjectQuotas } from '../../../core/apiTypes';
import { projectParams, projectSchema } from './schemas';

const limit = () => Joi.number().integer().min(0).allow(null).description('null: back to the host default');

export default defineRoute<{ quotas: Partial<Record<keyof ProjectQuotas, number | null>> }, unknown, { project: string }>({
  method: 'put',
  path: '/v1/projects/{project}',
  summary: "Set a project's quotas (boxes, cpus, ram_mb, storage_gb, volumes); makes the project if it is new",
  tag: 'projects',
  access: 'admin',
  params: projectParams,
  body: Joi.object({
    quotas: Joi.object({ boxes: limit(), cpus: limit(), ram_mb: limit(), storage_gb: limit(), volumes: limit() }).min(1).required(),
  }),
  responses: { 200: { description: 'the project', schema: projectSchema }, 409: { description: 'a new project, and no network is left for one (BOXHOST_BOX_SUBNET / BOXHOST_PROJECT_PREFIX)' } },
  handler: async ({ api, params, body }) => ({ body: await setProjectQuotas(api, params.project, body.quotas) }),
});
