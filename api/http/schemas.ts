import Joi from 'joi';

import { NAME_PATTERN } from '../../core/names';

/** DESIGN.md §3: lowercase a-z 0-9 -, 1–63 chars, alphanumeric at both ends, no `--`. */
export { NAME_PATTERN };

export const name = () =>
  Joi.string().pattern(NAME_PATTERN).messages({
    'string.pattern.base': 'must be 1-63 lowercase letters, digits or -, start and end with a letter or digit, and not contain --',
  });

/** Maps (`environment`, `env`, `tags`, `permissions`) have string keys and string values. */
export const stringMap = () => Joi.object().pattern(/^[\s\S]{1,256}$/, Joi.string().allow('').max(65536));

/** A variable name (core/packs.ts `ENV_NAME`) of at most 256 characters. The maps' keys are
 *  regular expressions, not schemas: OpenAPI then shows them as patternProperties. */
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]{0,255}$/;

/** Environment maps (a box's `environment`, an exec's or a service's `env`): keys are variable
 *  names and values hold no NUL, refused at the request (400 naming `environment.<key>`), not
 *  by the job that would start the box with them. */
export const envMap = () =>
  Joi.object()
    // A process environment cannot hold a NUL: refused here, not by the start that needs it.
    .pattern(ENV_KEY, Joi.string().allow('').max(65536).pattern(/^[^\0]*$/).messages({ 'string.pattern.base': 'must not contain a NUL character (no process environment can hold one)' }))
    .messages({ 'object.unknown': 'is not a variable name (letters, digits and _, not starting with a digit; at most 256)' });

/** Tags: any text but the list filter's separators (`tag=a,b=1`), or no filter could match them. */
export const tagMap = () =>
  Joi.object()
    .pattern(/^[^,=]{1,256}$/, Joi.string().allow('').max(65536))
    .messages({ 'object.unknown': "is not a tag name (1-256 characters, no ',' or '=': the list filter tag=a,b=1 uses them)" });

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
