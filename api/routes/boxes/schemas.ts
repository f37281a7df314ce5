import Joi from 'joi';
import { name, projectParam, stringMap, timestamp } from '../../http/schemas';
import { BOX_STATUSES } from '../../../core/box';

export const projectParams = Joi.object({ project: projectParam.required() });
export const boxParams = Joi.object({ project: projectParam.required(), name: name().required() });
export type BoxParams = { project: string; name: string };

/** Paths a data mount may never take (spec: public data mounts), compared after normalising. */
export const FORBIDDEN_MOUNT_PATHS = ['/', '/proc', '/sys', '/dev', '/run', '/etc', '/volumes', '/home', '/box'];

export const normalisePath = (p: string) => {
  const parts: string[] = [];
  for (const seg of p.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') parts.pop();
    else parts.push(seg);
  }
  return `/${parts.join('/')}`;
};

export const mountPath = () =>
  Joi.string()
    .pattern(/^\//)
    .max(4096)
    .custom((v: string, helpers) => (FORBIDDEN_MOUNT_PATHS.includes(normalisePath(v)) ? helpers.error('any.invalid') : normalisePath(v)))
    .messages({ 'string.pattern.base': 'must be an absolute path', 'any.invalid': `must not be one of ${FORBIDDEN_MOUNT_PATHS.join(' ')}` });

export const configSchema = Joi.object({
  cpus: Joi.number().integer().min(1).max(64),
  ram_mb: Joi.number().integer().min(64).max(1024 * 1024),
  region: Joi.string().max(63),
  storage_gb: Joi.number().integer().min(1).max(16384),
});

export const boxSchema = Joi.object({
  id: Joi.string().required(),
  name: Joi.string().required(),
  project: Joi.string().required(),
  status: Joi.string().valid(...BOX_STATUSES).required(),
  error: Joi.string().allow(null),
  created_at: timestamp().required(),
  updated_at: timestamp().required(),
  base: Joi.string().allow(null),
  fork: Joi.string().allow(null),
  config: configSchema.allow(null),
  data_mounts: Joi.array().items(Joi.object({ name: Joi.string(), path: Joi.string(), read_only: Joi.boolean(), ownership: Joi.object({ kind: Joi.string() }) })).allow(null),
  environment: stringMap().allow(null),
  lifecycle: Joi.string().allow(null),
  pack: Joi.string().allow(null),
  pack_rev: Joi.string().allow(null),
  publishes: Joi.array().items(Joi.object()).allow(null),
  rollback_to: Joi.string().allow(null),
  tags: stringMap().allow(null),
  termination_grace_period_seconds: Joi.number().integer().min(0).allow(null),
  url_settings: Joi.object({ auth: Joi.string() }).allow(null),
  address: Joi.string().allow(null),
  node: Joi.string().description('the node that holds the box'),
}).label('Box');

export const acceptedResponses = {
  200: { description: 'finished within ?wait', schema: boxSchema },
  202: { description: 'accepted: poll Location or GET /v1/operations/{Operation-Id}', schema: boxSchema },
  404: { description: 'no such box' },
  409: { description: 'the box is in a state that does not allow this' },
};
