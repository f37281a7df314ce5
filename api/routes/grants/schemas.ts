import Joi from 'joi';
import { name, timestamp } from '../../http/schemas';

export const grantParams = Joi.object({ name: name().required() });

export const permissions = () =>
  Joi.object()
    .pattern(/^[a-z][a-z0-9_]{0,62}$/, Joi.any().valid('read', 'write').messages({ 'any.only': 'must be "read" or "write"' }))
    .description('permission name → read | write');

export const repositories = () =>
  Joi.array()
    .items(Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9-]{0,38}\/[A-Za-z0-9._-]{1,100}$/).messages({ 'string.pattern.base': 'must be owner/name' }))
    .unique();

export const grantSchema = Joi.object({
  name: Joi.string().required(),
  permissions: Joi.object().required(),
  repositories: Joi.array().items(Joi.string()).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
}).label('Grant');
