import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { untilClientGone } from '../../http/clientGone';
import { envMap } from '../../http/schemas';
import { execInBox, ExecRequest, DEFAULT_EXEC_TIMEOUT_SECS, MAX_EXEC_TIMEOUT_SECS } from '../../../domain/exec';
import { boxParams, BoxParams } from './schemas';

/** The Exec result (a verb's answer adds `event_id`). */
export const execResultSchema = Joi.object({ detached: Joi.boolean(), exit_code: Joi.number().integer(), process: Joi.number().integer(), stdout: Joi.string().allow(''), stderr: Joi.string().allow(''), truncated: Joi.boolean() }).label('ExecResult');

export default defineRoute<ExecRequest, unknown, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/exec',
  summary: 'Run a command in a running box and answer its exit code and output',
  tag: 'exec',
  params: boxParams,
  body: Joi.object({
    command: Joi.array().items(Joi.string().max(65536)).min(1).max(4096).required(),
    cwd: Joi.string().pattern(/^\//).max(4096).messages({ 'string.pattern.base': 'must be an absolute path' }),
    env: envMap(),
    no_hup: Joi.boolean().default(false),
    shell: Joi.boolean().default(false),
    tty: Joi.boolean().default(false),
    user: Joi.string().pattern(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$/),
    timeout_secs: Joi.number().integer().min(1).max(MAX_EXEC_TIMEOUT_SECS).default(DEFAULT_EXEC_TIMEOUT_SECS)
      .description(`seconds before the command is killed (exit 124); at most ${MAX_EXEC_TIMEOUT_SECS}`),
  }),
  responses: {
    200: {
      description: 'the result (exit_code 124 when the timeout killed it; -1 and detached with no_hup)',
      schema: execResultSchema,
    },
    404: { description: 'no such box' },
    409: { description: 'the box is not running' },
    429: { description: 'too many concurrent execs in the box, for the token or on its node (see Retry-After)' },
  },
  handler: async ({ api, identity, params, body, res }) =>
    // A client that goes away before its answer takes its command with it (unless no_hup):
    // nobody would read the output, and the process would hold a slot until its timeout.
    ({ body: await untilClientGone(res, (signal) => execInBox(api, identity, params.project, params.name, body, { slots: api.limits.execSlots, signal })) }),
});
