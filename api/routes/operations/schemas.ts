import Joi from 'joi';
import { timestamp } from '../../http/schemas';

/** Any string: an id that cannot exist is as unknown as one that does not (404, not 400);
 *  domain/operations.ts knows the shape. */
export const operationParams = Joi.object({ id: Joi.string().required().description('op_ and up to 40 lowercase letters or digits') });

export const OPERATION_STATUSES = ['queued', 'running', 'succeeded', 'failed'] as const;

export const operationSchema = Joi.object({
  id: Joi.string().required(),
  kind: Joi.string().required(),
  status: Joi.string().valid(...OPERATION_STATUSES).required(),
  resource: Joi.string().required(),
  progress: Joi.number().integer().min(0).max(100).allow(null).required(),
  error: Joi.string().allow(null).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
}).label('Operation');
