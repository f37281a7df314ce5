import type http from 'node:http';
import Joi from 'joi';
import type { Application } from 'express-ws';
import type WebSocket from 'ws';
import type { ApiContext, Identity } from '../context';
import { CONSOLE_COMMAND, ExecSession, ExecSessionRequest, openSession, relaySession } from '../../domain/sessions';
import { validate } from '../http/route';
import { NAME_PATTERN } from '../http/schemas';
import { MAX_EXEC_TIMEOUT_SECS } from '../../core/box';

/** The WebSocket routes (DESIGN.md §4), OpenAPI-style. */
export const EXEC_WS_PATH = '/v1/projects/{project}/boxes/{name}/exec/ws';
export const CONSOLE_PATH = '/v1/projects/{project}/boxes/{name}/console';
export const SESSION_PATHS = [EXEC_WS_PATH, CONSOLE_PATH];

/** A handshake whose session has been started, waiting for its upgrade. */
type SessionRequest = http.IncomingMessage & { session?: ExecSession };

/** The largest WebSocket message the api takes (the node agent's own cap). */
export const MAX_WS_MESSAGE = 16 << 20;

/** How long a started session waits for its socket's upgrade before it is ended. */
const UPGRADE_WAIT_MS = 10_000;

const bool = Joi.boolean().truthy('1').falsy('0');
const size = Joi.number().integer().min(1).max(65535);
const execQuery = Joi.object({
  command: Joi.array().items(Joi.string().max(65536)).min(1).max(4096).single().required(),
  tty: bool.default(false),
  cwd: Joi.string().pattern(/^\//).max(4096).messages({ 'string.pattern.base': 'must be an absolute path' }),
  user: Joi.string().pattern(/^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$/),
  env: Joi.array().items(Joi.string().pattern(/^[A-Za-z_][A-Za-z0-9_]*=/)).single(),
  cols: size,
  rows: size,
  // The process outlives the socket: closing it lets go of the process instead of ending it.
  no_hup: bool.default(false),
  // As HTTP exec's, but no default: a terminal session lasts as long as its socket.
  timeout_secs: Joi.number().integer().min(1).max(MAX_EXEC_TIMEOUT_SECS),
  ticket: Joi.string(),
});
const consoleQuery = Joi.object({ user: execQuery.extract('user'), cols: size, rows: size, ticket: Joi.string() });

const segments = (url: string) => new URL(url, 'http://ws.invalid').pathname.split('/').map((s) => decodeURIComponent(s));

/** The query as Joi wants it: repeated names as arrays. */
function queryOf(url: string): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of new URL(url, 'http://ws.invalid').searchParams) {
    const had = out[k];
    out[k] = had === undefined ? v : Array.isArray(had) ? [...had, v] : [had, v];
  }
  return out;
}

/**
 * Before the upgrade (api/http/upgrade.ts): the query checked, the box found and running, the
 * process started on its node. Every refusal is the contract's status and error body, and no
 * upgrade; what passes has its session waiting on the request.
 */
export async function prepareSession(api: ApiContext, req: http.IncomingMessage, identity: Identity): Promise<void> {
  const seg = segments(req.url ?? '/');
  const [project, name, kind] = [seg[3], seg[5], seg[6]];
  validate(Joi.object({ project: Joi.string().pattern(NAME_PATTERN), name: Joi.string().pattern(NAME_PATTERN) }), { project, name }, 'path');
  let request: ExecSessionRequest;
  // Routes match in any case, as express matches them (`…/EXEC/WS` is the exec route).
  if (kind?.toLowerCase() === 'exec') {
    const q = validate(execQuery, queryOf(req.url ?? '/'), 'query') as { command: string[]; tty: boolean; cwd?: string; user?: string; env?: string[]; cols?: number; rows?: number; no_hup: boolean; timeout_secs?: number };
    const env = Object.fromEntries((q.env ?? []).map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
    request = { command: q.command, tty: q.tty, cwd: q.cwd, user: q.user, env, cols: q.cols, rows: q.rows, ...(q.no_hup ? { noHup: true } : {}), ...(q.timeout_secs ? { timeoutMs: q.timeout_secs * 1000 } : {}) };
  } else {
    const q = validate(consoleQuery, queryOf(req.url ?? '/'), 'query') as { user?: string; cols?: number; rows?: number };
    request = { command: CONSOLE_COMMAND, tty: true, user: q.user, cols: q.cols ?? 80, rows: q.rows ?? 24 };
  }
  const session = await openSession(api, identity, project, name, request, api.limits.execSlots);
  // The client left while the process was starting: nothing will relay it.
  if (req.socket.destroyed) return session.close();
  (req as SessionRequest).session = session;
  // A socket that never completes its upgrade must not leave the process running.
  const timer = setTimeout(() => session.close(), UPGRADE_WAIT_MS);
  timer.unref();
  req.socket.once('close', () => {
    if ((req as SessionRequest).session) session.close();
  });
  (req as SessionRequest & { upgradeTimer?: NodeJS.Timeout }).upgradeTimer = timer;
}

/** The express-ws routes: each relays the session its handshake started. */
export function mountSessionRoutes(app: Application): void {
  const relay = (ws: WebSocket, req: SessionRequest & { upgradeTimer?: NodeJS.Timeout }) => {
    const session = req.session;
    clearTimeout(req.upgradeTimer);
    req.session = undefined;
    if (!session) return ws.close(1011, 'no session');
    relaySession(ws, session);
  };
  for (const p of SESSION_PATHS) app.ws(p.replace(/\{(\w+)\}/g, ':$1'), relay as never);
}
