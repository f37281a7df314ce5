import Joi from 'joi';
import { envMap, name, projectParam, stringMap } from '../../http/schemas';
import { MAX_STOP_GRACE_SECS } from '../../../core/box';

export const serviceParams = Joi.object({ project: projectParam.required(), name: name().required(), service: name().required() });
export type ServiceParams = { project: string; name: string; service: string };

/** Signal names as `kill -l` writes them, with or without SIG (DESIGN.md §6). */
export const signalName = () => Joi.string().pattern(/^(SIG)?(HUP|INT|QUIT|KILL|USR1|USR2|TERM|ALRM|WINCH|STOP|CONT|PWR)$/i).messages({ 'string.pattern.base': 'must be a signal name (TERM, SIGTERM, INT, HUP, QUIT, KILL, USR1, USR2, ALRM, WINCH, STOP, CONT, PWR)' });

export const port = () => Joi.number().integer().min(0).max(65535);

export const MAX_READY_SECS = 600;

/** What a publish call may ask besides its port (box and service publishes alike). */
export const publishOptions = (defaultName: string) => ({
  name: name().description(`default: ${defaultName}`),
  public: Joi.boolean().description('default true; false needs a bearer token (falls back to public, with a warning, when no auth provider is configured)'),
  force: Joi.boolean().description('replace a publish of the same name'),
});

export const publishSchema = Joi.object({
  name: Joi.string().required(),
  host: Joi.string().required(),
  port: Joi.number().integer().min(0).required(),
  public: Joi.boolean().required(),
  url: Joi.string().required(),
  warning: Joi.string().description('present only when a non-public publish fell back to public: no auth provider is configured'),
}).label('Publish');

/** The service start route's body; a pack revision's `services` take the same (docs/packs.md). */
export const serviceStartBody = Joi.object({
  name: name().required(),
  command: Joi.array().items(Joi.string().max(65536)).min(1).max(4096).required(),
  cwd: Joi.string().pattern(/^\//).max(4096).messages({ 'string.pattern.base': 'must be an absolute path' }),
  env: envMap(),
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
  stop: Joi.object({ grace_secs: Joi.number().integer().min(0).max(MAX_STOP_GRACE_SECS), signal: signalName() }),
  tags: stringMap(),
  user: Joi.string().pattern(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$/).messages({ 'string.pattern.base': 'must be a user name or uid, optionally :group' }),
}).label('ServiceStart');

export const serviceSchema = Joi.object({
  name: Joi.string().required(),
  command: Joi.array().items(Joi.string().allow('')).required(),
  commands: Joi.object({ start: Joi.string().allow(''), publish: Joi.string().allow(''), unpublish: Joi.string().allow('') }).required()
    .description('`box` command lines that reproduce the service; secret_env values are never written (`--env KEY` takes it from the environment)'),
  restart: Joi.valid('always', 'on-failure', 'never').required(),
  restarts: Joi.number().integer().min(0).required(),
  state: Joi.valid('starting', 'running', 'restarting', 'stopped', 'exited', 'failed', 'corrupt').required(),
  error: Joi.string().description('only on a corrupt spec\'s tombstone: why it did not load'),
  last_exit_code: Joi.number().integer(),
  pid: Joi.number().integer().min(0).required().description('in the box (0: not running)'),
  port: Joi.number().integer().min(0).required(),
  tags: stringMap().required(),
  url: Joi.string().description('its publish\'s url, when published'),
  user: Joi.string().allow('').required(),
  warning: Joi.string(),
}).label('Service');

export const serviceErrors = {
  404: { description: 'no such box or service' },
  409: { description: 'the box is not running' },
};
