import Joi from 'joi';
import { timestamp } from '../../http/schemas';

export const webhookSchema = Joi.object({
  id: Joi.string().required(),
  url: Joi.string().required(),
  project: Joi.string().allow(null).required(),
  kinds: Joi.array().items(Joi.string()).allow(null).required(),
  created_at: timestamp().required(),
  last_attempt_at: timestamp().allow(null).required(),
  last_success_at: timestamp().allow(null).required(),
  last_status: Joi.number().integer().allow(null).required(),
  last_error: Joi.string().allow(null).required(),
  failures: Joi.number().integer().required(),
  disabled_at: timestamp().allow(null).required(),
}).label('Webhook');
