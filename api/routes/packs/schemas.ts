import Joi from 'joi';
import { envMap, name, NAME_PATTERN, timestamp } from '../../http/schemas';
import { serviceStartBody } from '../services/schemas';
import { ENV_NAME } from '../../../core/packs';

export const packParams = Joi.object({ name: name().required() });
export type PackParams = { name: string };

const envName = () => Joi.string().pattern(ENV_NAME).max(256).messages({ 'string.pattern.base': 'must be a variable name (letters, digits, _; not starting with a digit)' });

export const verbSpec = Joi.object({
  command: Joi.array().items(Joi.string().max(65536)).min(1).max(4096).required(),
  description: Joi.string().allow('').max(1024),
  env: Joi.array().items(envName()).unique().max(256),
}).label('PackVerb');

export const revisionSpec = Joi.object({
  base: name().required().description('the base the revision builds (its version follows the build rule)'),
  parent: Joi.string().max(128).required().description('the base it builds from (name or name@version)'),
  script: Joi.string().max(1024 * 1024).required(),
  services: Joi.array().items(serviceStartBody).max(64),
  verbs: Joi.object().pattern(NAME_PATTERN, verbSpec).max(256),
  outputs: envMap().max(256),
}).label('PackRevisionSpec');

/** The manifest `POST /v1/packs` takes (JSON, or YAML with a YAML content type). */
export const manifestSchema = Joi.object({
  name: name().required(),
  description: Joi.string().allow('', null).max(4096),
  revisions: Joi.object().pattern(NAME_PATTERN, revisionSpec).min(1).max(64).required(),
  default_rev: name().required(),
}).label('PackManifest');

export const packSchema = Joi.object({
  name: Joi.string().required(),
  description: Joi.string().allow(null, '').required(),
  rev: Joi.string().required().description("the installed manifest's content hash"),
  default_rev: Joi.string().required().description('the label of the default revision'),
  revisions: Joi.object().pattern(/^/, revisionSpec.keys({ rev: Joi.string().required().description("the revision's content hash (what an instance pins as pack_rev)") })).required(),
  instances: Joi.number().integer().min(0).required(),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
}).label('Pack');
