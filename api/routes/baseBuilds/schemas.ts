import Joi from 'joi';
import { timestamp } from '../../http/schemas';

export const buildParams = Joi.object({ id: Joi.string().max(64).required() });
export type BuildParams = { id: string };

export const buildStartSchema = Joi.object({
  id: Joi.string().required(),
  status: Joi.valid('queued', 'running', 'succeeded', 'failed').required(),
  version: Joi.string().required(),
  cached: Joi.boolean().required().description('the version existed: nothing was built'),
}).label('BaseBuildStart');

export const buildSchema = Joi.object({
  id: Joi.string().required(),
  status: Joi.valid('queued', 'running', 'succeeded', 'failed').required(),
  version: Joi.string().required(),
  base: Joi.string().required(),
  parent: Joi.string().required().description('the parent as resolved, name@version'),
  cached: Joi.boolean().required(),
  error: Joi.string().allow(null).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
  project: Joi.string().required().description('where the temporary box runs'),
  box: Joi.string().allow(null).required().description('the temporary box while the build runs'),
  exit_code: Joi.number().integer().allow(null).required().description("the script's exit code once it ended"),
}).label('BaseBuild');
