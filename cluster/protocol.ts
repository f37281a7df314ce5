import Joi from 'joi';
import type { ErrorCode } from '../core/errors';
import { EXEC_OUTPUT_CAP_BYTES } from './types';

/**
 * The node agent's wire protocol (docs/nodes.md): JSON over HTTP under `/agent/v1`, every
 * call with `Authorization: Bearer <BOXHOST_CLUSTER_SECRET>`. The api treats every answer as
 * untrusted input: bodies are size-capped and checked against these schemas before use.
 */
export const AGENT_PREFIX = '/agent/v1';
/** Express route patterns; `agentPath` fills in the box id. */
export const agentRoutes = {
  health: `${AGENT_PREFIX}/health`,
  exec: `${AGENT_PREFIX}/boxes/:boxId/exec`,
  limits: `${AGENT_PREFIX}/boxes/:boxId/limits`,
  snapshots: `${AGENT_PREFIX}/boxes/:boxId/snapshots`,
};
export const agentPath = (route: keyof typeof agentRoutes, boxId = '') => agentRoutes[route].replace(':boxId', boxId);

export const BOX_ID_PATTERN = /^[a-z0-9]{1,32}$/;

/** An exec answer holds two streams of at most EXEC_OUTPUT_CAP_BYTES each, which JSON may
 *  grow 6-fold (a control byte is `\u0000`), plus framing. */
export const MAX_AGENT_ANSWER_BYTES = 2 * 6 * EXEC_OUTPUT_CAP_BYTES + 1024 * 1024;

const stringMap = Joi.object().pattern(/^/, Joi.string().allow(''));

/** Exec request body: as `ExecRequest`, with stdin in base64. */
export const execRequestSchema = Joi.object({
  command: Joi.array().items(Joi.string().allow('')).min(1).required(),
  cwd: Joi.string(),
  env: stringMap,
  user: Joi.string(),
  tty: Joi.boolean(),
  detach: Joi.boolean(),
  timeoutMs: Joi.number().integer().min(1),
  stdin: Joi.string().base64(),
});

export const execResultSchema = Joi.object({
  exitCode: Joi.number().integer().required(),
  stdout: Joi.string().allow('').required(),
  stderr: Joi.string().allow('').required(),
  pid: Joi.number().integer().min(0).required(),
  detached: Joi.boolean().required(),
  truncated: Joi.boolean().required(),
});

export const limitsSchema = Joi.object({ cpus: Joi.number().integer().min(1), ramMb: Joi.number().integer().min(4) });

export const snapshotsSchema = Joi.object({
  snapshots: Joi.array().max(100000).items(Joi.object({ name: Joi.string().max(255).required(), createdAt: Joi.string().max(64).required(), sizeBytes: Joi.number().min(0).required() })).required(),
});


/** The error codes an agent may answer; anything else is read as `internal`. */
export const AGENT_ERROR_CODES: readonly ErrorCode[] = ['invalid_argument', 'unauthenticated', 'not_found', 'conflict', 'rate_limited', 'unavailable', 'internal', 'insufficient_storage'];

/** The wait a node's `rate_limited` answer (its exec cap) stands for: the error body carries no
 *  headers, so the api adds `Retry-After` itself. */
export const AGENT_RETRY_AFTER_S = 1;

export const errorBodySchema = Joi.object({
  error: Joi.object({
    code: Joi.string().max(64).required(),
    message: Joi.string().max(4000).allow('').required(),
    details: Joi.array().max(100).items(Joi.object({ field: Joi.string().max(200).allow('').required(), issue: Joi.string().max(2000).allow('').required() })),
  }).required(),
});
