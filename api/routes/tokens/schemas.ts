import Joi from 'joi';
import { timestamp } from '../../http/schemas';

export const tokenSchema = Joi.object({
  id: Joi.string().required(),
  name: Joi.string().required(),
  projects: Joi.array().items(Joi.string()).allow(null).required(),
  created_at: timestamp().required(),
  expires_at: timestamp().allow(null).required(),
  last_used_at: timestamp().allow(null).required(),
  scopes: Joi.array().items(Joi.string()).description('present only when the token has scopes'),
}).label('Token');
