import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name, stringMap } from '../../http/schemas';
import { startService } from '../../../domain/services';
import type { ServiceStartRequest } from '../../../core/apiTypes';
import { boxParams, BoxParams } from '../boxes/schemas';
import { MAX_GRACE_SECS, MAX_READY_SECS, port, serviceSchema, signalName } from './schemas';

export default defineRoute<ServiceStartRequest, unknown, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/services',
  summary: 'Start a supervised service in a running box (replacing one of the same name); with `ready`, answer once its gate passed',
  tag: 'services',
  params: boxParams,
  body: Joi.object({
    name: name().required(),
    command: Joi.array().items(Joi.string().max(65536)).min(1).max(4096).required(),
    cwd: Joi.string().pattern(/^\//).max(4096).messages({ 'string.pattern.base': 'must be an absolute path' }),
    env: stringMap(),
    port: port(),
    publish: Joi.object({ name: name(), public: Joi.boolean() }),
    ready: Joi.object({
      http: Joi.string().pattern(/^\/[^\s]*$/).max(2048).messages({ 'string.pattern.base': 'must be a path (/healthz) without spaces' }),
      port: port().min(1),
      status: Joi.number().integer().min(100).max(599),
      tcp: port().min(1),
      timeout_secs: Joi.number().integer().min(1).max(MAX_READY_SECS),
    }),
    restart: Joi.valid('always', 'on-failure', 'never'),
    secret_env: Joi.array().items(Joi.string().max(256)).unique(),
    stop: Joi.object({ grace_secs: Joi.number().integer().min(0).max(MAX_GRACE_SECS), signal: signalName() }),
    tags: stringMap(),
    user: Joi.string().pattern(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$/).messages({ 'string.pattern.base': 'must be a user name or uid, optionally :group' }),
  }),
  responses: {
    201: { description: 'started (its gate passed)', schema: serviceSchema },
    200: { description: 'replaced a service of the same name', schema: serviceSchema },
    400: { description: 'a bad field, a secret_env that is not a key of env, publish without port, a cwd or user the box does not have, a command it cannot find' },
    404: { description: 'no such box' },
    409: { description: 'the box is not running; the publish name is taken; `not_ready`: the ready gate failed (details name it, the message holds the last output lines)' },
  },
  handler: async ({ api, identity, params, body }) => {
    const { service, replaced } = await startService(api, identity, params.project, params.name, body);
    return { status: replaced ? 200 : 201, body: service };
  },
});
