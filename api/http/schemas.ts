import Joi from 'joi';

import { NAME_PATTERN } from '../../core/names';

/** DESIGN.md §3: lowercase a-z 0-9 -, 1–63 chars, alphanumeric at both ends, no `--`. */
export { NAME_PATTERN };

export const name = () =>
  Joi.string().pattern(NAME_PATTERN).messages({
    'string.pattern.base': 'must be 1-63 lowercase letters, digits or -, start and end with a letter or digit, and not contain --',
  });

/** Maps (`environment`, `env`, `tags`, `permissions`) have string keys and string values. */
export const stringMap = () => Joi.object().pattern(Joi.string().min(1).max(256), Joi.string().allow('').max(65536));

export const timestamp = () => Joi.string().isoDate();

export const errorBody = Joi.object({
  error: Joi.object({
    code: Joi.string().required(),
    message: Joi.string().required(),
    details: Joi.array().items(Joi.object({ field: Joi.string(), issue: Joi.string() })).required(),
  }).required(),
}).label('Error');

export const projectParam = Joi.string().pattern(NAME_PATTERN).messages({ 'string.pattern.base': 'is not a valid project name' });

/** Errors every route may answer: added to each OpenAPI entry. */
export const COMMON_ERRORS: Record<number, string> = {
  400: 'invalid_argument',
  401: 'unauthenticated',
  429: 'rate_limited (per-token request rate; see Retry-After)',
  500: 'internal',
  503: 'unavailable',
};
