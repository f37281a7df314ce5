import Joi from 'joi';
import { name, timestamp } from '../../http/schemas';

/** `name` (its newest version) or `name@version`. */
export const baseSpec = () =>
  Joi.string().max(200).pattern(/^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(@[A-Za-z0-9][A-Za-z0-9.:_-]*)?$/).messages({ 'string.pattern.base': 'must be a base name, or name@version' });
export const baseParams = Joi.object({ name: baseSpec().required() });
export type BaseParams = { name: string };

const optionalString = (max: number) => Joi.string().allow(null, '').max(max);

/** The provenance fields a save or an import may store (the spec's names). */
export const provenanceFields = {
  builder: optionalString(200),
  parent: optionalString(200),
  parent_alias: optionalString(200),
  parent_version: optionalString(200),
  script: optionalString(1024 * 1024),
  script_sha256: Joi.string().allow(null, '').pattern(/^[0-9a-f]{64}$/).messages({ 'string.pattern.base': 'must be 64 lowercase hex digits' }),
};

export const baseSchema = Joi.object({
  name: Joi.string().required(),
  version: Joi.string().allow(null).required(),
  created_at: timestamp().required(),
  size_bytes: Joi.number().integer().min(0).required(),
  origin: Joi.valid('builtin', 'saved', 'imported', 'built').description('built in (every node makes it), saved from a box, imported, or made by a base build'),
  project: Joi.string().allow(null).description("a saved base's project (only it uses and sees the base); null: every project's"),
  builder: Joi.string().allow(null),
  parent: Joi.string().allow(null),
  parent_alias: Joi.string().allow(null),
  parent_version: Joi.string().allow(null),
  script: Joi.string().allow(null),
  script_sha256: Joi.string().allow(null),
}).label('Base');

export const acceptedBaseResponses = {
  202: { description: 'accepted: the base as known so far (no size yet); poll Location or GET /v1/operations/{Operation-Id}', schema: baseSchema },
  200: { description: 'with ?wait=S: finished in time (the operation may still have failed: read it)', schema: baseSchema },
};

export const baseErrors = {
  404: { description: 'no such base (or one of a project the token does not reach)' },
  503: { description: "the node holding the base is not answering" },
};
