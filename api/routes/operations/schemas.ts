import Joi from 'joi';
import { timestamp } from '../../http/schemas';

export const operationParams = Joi.object({ id: Joi.string().pattern(/^op_[a-z0-9]{1,40}$/).required() });

export const operationSchema = Joi.object({
  id: Joi.string().required(),
  kind: Joi.string().required(),
  status: Joi.string().valid('queued', 'running', 'succeeded', 'failed').required(),
  resource: Joi.string().required(),
  progress: Joi.number().integer().min(0).max(100).allow(null).required(),
  error: Joi.string().allow(null).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
}).label('Operation');
