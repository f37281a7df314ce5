import Joi from 'joi';
import { projectParam, timestamp } from '../../http/schemas';

export const projectParams = Joi.object({ project: projectParam.required() });

const counts = Joi.object({
  boxes: Joi.number().integer(),
  cpus: Joi.number().integer(),
  ram_mb: Joi.number().integer(),
  storage_gb: Joi.number().integer(),
  volumes: Joi.number().integer(),
});

export const projectSchema = Joi.object({
  name: Joi.string().required(),
  created_at: timestamp().required(),
  box_count: Joi.number().integer().required(),
  quotas: counts.required().description("the project's own quotas where set, else the host's defaults"),
  usage: counts.required().description('what its boxes hold now'),
}).label('Project');
