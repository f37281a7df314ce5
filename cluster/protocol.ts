import Joi from 'joi';
import type { ErrorCode } from '../core/errors';
import { MAX_EXEC_TIMEOUT_SECS } from '../core/box';
import { NAME_PATTERN } from '../core/names';
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
  /** GET: the box's snapshots; DELETE `?name=`: one of them. */
  snapshots: `${AGENT_PREFIX}/boxes/:boxId/snapshots`,
  /** GET: a data volume's used bytes and user snapshots (docs/data.md). */
  volumeInfo: `${AGENT_PREFIX}/volumes/:volumeId`,
  /** GET `?name=`: what a restore to that snapshot would take from others. */
  snapshotBlockers: `${AGENT_PREFIX}/boxes/:boxId/snapshots/blockers`,
  /** GET raw bytes (the stat in FILE_STAT_HEADER), PUT raw body (answers the stat), DELETE;
   *  the path in `?path=`. */
  files: `${AGENT_PREFIX}/boxes/:boxId/files`,
  fileStat: `${AGENT_PREFIX}/boxes/:boxId/files/stat`,
  fileList: `${AGENT_PREFIX}/boxes/:boxId/files/list`,
  /** WebSocket: the first text message is the ExecSessionRequest, answered `{"ok": true}` (then
   *  the boxhost.v1.channel framing) or the error body (then close). */
  execWs: `${AGENT_PREFIX}/boxes/:boxId/exec/ws`,
  /** Upgrade `boxhost-tunnel`, `?address=&port=`: a raw TCP connection to a port of the box
   *  (101, then bytes both ways), for the publish proxy. */
  tunnel: `${AGENT_PREFIX}/boxes/:boxId/tunnel`,
  /** POST `{op, …}` (serviceCallSchema): a box's services; answers JSON. */
  services: `${AGENT_PREFIX}/boxes/:boxId/services`,
  /** GET `?name=&tail=&follow=`: a service's log, streamed. */
  serviceLogs: `${AGENT_PREFIX}/boxes/:boxId/services/logs`,
  /** PUT raw tar or gzip body: staged and checked (answers StagedImport); DELETE `?token=`. */
  baseImports: `${AGENT_PREFIX}/bases/imports`,
  /** GET `?name=&version=`: the base as a tar stream; DELETE: the node's copy. */
  bases: `${AGENT_PREFIX}/bases`,
};

const serviceName = Joi.string().pattern(NAME_PATTERN);

/** A service call to a node: one route, the op says which. */
export const serviceCallSchema = Joi.alternatives().try(
  Joi.object({
    op: Joi.valid('start').required(),
    spec: Joi.object({ name: serviceName.required(), command: Joi.array().items(Joi.string().allow('')).min(1).required() }).unknown(true).required(),
    gate: Joi.object({ port: Joi.number().integer().min(1).max(65535).required(), path: Joi.string().max(2048), status: Joi.number().integer().min(100).max(599), timeoutMs: Joi.number().integer().min(0).max(3_600_000).required() }),
  }),
  Joi.object({ op: Joi.valid('list').required() }),
  Joi.object({ op: Joi.valid('get', 'delete').required(), name: serviceName.required() }),
  Joi.object({
    op: Joi.valid('control').required(),
    name: serviceName.required(),
    action: Joi.valid('start', 'stop', 'restart').required(),
    signal: Joi.string().max(16),
    graceMs: Joi.number().integer().min(0).max(3_600_000),
  }),
);

export const serviceStateSchema = Joi.object({
  name: serviceName.required(),
  state: Joi.valid('starting', 'running', 'restarting', 'stopped', 'exited', 'failed', 'corrupt').required(),
  pid: Joi.number().integer().min(0).max(4_194_304).required(),
  restarts: Joi.number().integer().min(0).required(),
  lastExitCode: Joi.number().integer().min(0).max(255).allow(null).required(),
  error: Joi.string().max(1000).allow(''),
  spec: Joi.object().unknown(true),
});
export const serviceStartAnswerSchema = Joi.object({ service: serviceStateSchema.required(), replaced: Joi.boolean().required() });
export const serviceListSchema = Joi.object({ services: Joi.array().max(10_000).items(serviceStateSchema).required() });

export const execSessionSchema = Joi.object({
  command: Joi.array().items(Joi.string().allow('')).min(1).required(),
  cwd: Joi.string(),
  env: Joi.object().pattern(/^/, Joi.string().allow('')),
  user: Joi.string(),
  tty: Joi.boolean(),
  cols: Joi.number().integer().min(1).max(65535),
  rows: Joi.number().integer().min(1).max(65535),
  noHup: Joi.boolean(),
  timeoutMs: Joi.number().integer().min(1).max(MAX_EXEC_TIMEOUT_SECS * 1000),
});

/** A file read's stat travels beside its bytes in this header: base64url of its JSON. */
export const FILE_STAT_HEADER = 'x-boxhost-file-stat';

export const fileStatSchema = Joi.object({
  name: Joi.string().max(4096).allow('').required(),
  path: Joi.string().max(8192).required(),
  type: Joi.valid('file', 'dir', 'symlink', 'other').required(),
  size: Joi.number().integer().min(0).required(),
  mode: Joi.string().pattern(/^[0-7]{4}$/).required(),
  mtime: Joi.string().max(64).required(),
  target: Joi.string().max(8192).allow(''),
});

export const fileListSchema = Joi.object({ entries: Joi.array().max(5000).items(fileStatSchema).required(), truncated: Joi.boolean().required() });
export const agentPath = (route: keyof typeof agentRoutes, boxId = '') => agentRoutes[route].replace(':boxId', boxId);

/** The Upgrade token of a tunnel. */
export const TUNNEL_PROTOCOL = 'boxhost-tunnel';

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

export const volumeInfoSchema = Joi.object({
  usedBytes: Joi.number().min(0).required(),
  snapshots: Joi.array().max(100000).items(Joi.object({ name: Joi.string().max(255).required(), createdAt: Joi.string().max(64).required(), sizeBytes: Joi.number().min(0).required(), description: Joi.string().max(4096) })).required(),
});

export const snapshotsSchema = Joi.object({
  snapshots: Joi.array().max(100000).items(Joi.object({ name: Joi.string().max(255).required(), createdAt: Joi.string().max(64).required(), sizeBytes: Joi.number().min(0).required(), description: Joi.string().max(4096) })).required(),
});

export const snapshotBlockersSchema = Joi.object({
  snapshots: Joi.array().max(100000).items(Joi.string().max(255)).required(),
  forks: Joi.array().max(100000).items(Joi.string().max(255)).required(),
});

/** A snapshot name in a node call (the name rule; the storage checks it again). */
export const snapshotNameSchema = Joi.string().pattern(NAME_PATTERN).required();

export const baseRefSchema = Joi.object({ name: Joi.string().pattern(NAME_PATTERN).required(), version: Joi.string().pattern(/^[0-9a-f]{12}$|^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/).required() });
export const stagingTokenSchema = Joi.string().pattern(/^[0-9a-f]{32}$/).required();
export const stagedImportSchema = Joi.object({
  token: stagingTokenSchema,
  bytes: Joi.number().integer().min(0).required(),
  sha256: Joi.string().pattern(/^[0-9a-f]{64}$/).required(),
  entries: Joi.number().integer().min(0).required(),
  unpackedBytes: Joi.number().integer().min(0).required(),
  dropped: Joi.number().integer().min(0).required(),
  setidCleared: Joi.number().integer().min(0).required(),
});


/** The error codes an agent may answer; anything else is read as `internal`. */
export const AGENT_ERROR_CODES: readonly ErrorCode[] = ['invalid_argument', 'unauthenticated', 'permission_denied', 'not_found', 'conflict', 'rate_limited', 'unavailable', 'internal', 'insufficient_storage', 'payload_too_large'];

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
