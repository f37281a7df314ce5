import type { ServiceStartRequest } from './apiTypes';
import type { Config } from './config';
import { invalid, invalidField } from './errors';

/**
 * The rules of a service start that need more than the schema, and what boxd is handed (docs/
 * services.md): shared by the api's service start (domain/services.ts) and a pack instance's
 * services started on its node (jobs/packServices.ts).
 */

/** A ready gate as the node looks at it (the same shape as cluster/types.ts ServiceGate). */
export interface ReadyGate {
  port: number;
  path?: string;
  status?: number;
  timeoutMs: number;
}

/** What boxd keeps of a service (its own fields, and the api's beside them). */
export type ServiceSpec = { name: string; command: string[] } & Record<string, unknown>;

/** The publish name rule (the name rule: lowercase a-z 0-9 -, 1–63, no `--`). */
export function checkPublishName(name: string, field = 'name'): string {
  if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(name) || name.includes('--')) {
    throw invalidField(field, 'must be lowercase a-z, 0-9 and -, 1 to 63 characters, start and end alphanumeric, without --');
  }
  return name;
}

/** DESIGN.md §6: a ready gate waits 30 s unless told. */
export const READY_TIMEOUT_DEFAULT_S = 30;

/** The rules joi cannot say: each `secret_env` a key of `env`, `publish` needs `port`, a gate
 *  has one kind and a port. Answers the gate to wait for. */
export function checkStart(req: ServiceStartRequest): ReadyGate | undefined {
  for (const k of req.secret_env ?? []) {
    if (!Object.prototype.hasOwnProperty.call(req.env ?? {}, k)) throw invalidField('secret_env', `${k} is not a key of env`);
  }
  if (req.publish && !req.port) throw invalidField('publish', 'a publish needs the service\'s port');
  if (req.publish?.name !== undefined) checkPublishName(req.publish.name, 'publish.name');
  const r = req.ready;
  if (!r) return undefined;
  if (r.http !== undefined && r.tcp !== undefined) throw invalid('ready: give http or tcp, not both', [{ field: 'ready', issue: 'http and tcp are exclusive' }]);
  if (r.http === undefined && r.tcp === undefined) throw invalid('ready: give http (a path) or tcp (a port)', [{ field: 'ready', issue: 'needs http or tcp' }]);
  const timeoutMs = (r.timeout_secs ?? READY_TIMEOUT_DEFAULT_S) * 1000;
  if (r.tcp !== undefined) return { port: r.tcp, timeoutMs };
  const port = r.port ?? req.port;
  if (!port) throw invalidField('ready.port', 'an http gate needs ready.port or the service\'s port');
  return { port, path: r.http, status: r.status, timeoutMs };
}

/** What boxd keeps in the box: its own fields, and the api's beside them (docs/services.md). */
export function specOf(req: ServiceStartRequest): ServiceSpec {
  const spec: ServiceSpec = { name: req.name, command: req.command };
  for (const k of ['cwd', 'env', 'user', 'restart', 'stop', 'port', 'publish', 'ready', 'secret_env', 'tags'] as const) {
    if (req[k] !== undefined) spec[k] = req[k];
  }
  return spec;
}

/** A publish's host name: `<publish>--<box>--<project>.<publish domain>` (docs/services.md). */
export const publishHost = (config: Pick<Config, 'publishDomain'>, name: string, box: string, project: string) => `${name}--${box}--${project}.${config.publishDomain}`;

/** A publish's URL through the proxy (the port left out when it is 80, or 0: not known here). */
export const publishUrl = (config: Pick<Config, 'proxyPort'>, host: string) =>
  `http://${host}${config.proxyPort === 80 || config.proxyPort === 0 ? '' : `:${config.proxyPort}`}`;
