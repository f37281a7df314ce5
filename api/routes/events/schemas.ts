import Joi from 'joi';
import { name, timestamp } from '../../http/schemas';

/** The spec's pack verb-execution event. */
export const eventSchema = Joi.object({
  id: Joi.string().required(),
  ts: timestamp().required(),
  pack: Joi.string().required(),
  rev: Joi.string().required(),
  verb: Joi.string().required(),
  args: Joi.array().items(Joi.string().allow('')).required(),
  env_set: Joi.array().items(Joi.string()).required().description('the names of the variables the run set, never their values'),
  box_name: Joi.string().required(),
  project: Joi.string().required(),
  who: Joi.string().required().description("the token's name"),
  outcome: Joi.valid('success', 'failure', 'error').required().description('success: exit 0; failure: another exit code; error: it could not run'),
  duration_ms: Joi.number().integer().min(0).required(),
  error: Joi.string(),
  exit_code: Joi.number().integer(),
}).label('Event');

/** The filters the list and the stream share (DESIGN.md §4). */
export const eventFilters = {
  project: name(),
  box: name(),
  pack: name(),
  verb: name(),
  outcome: Joi.valid('success', 'failure', 'error'),
};
