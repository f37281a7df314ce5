import crypto from 'node:crypto';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import { endWithError } from '../../core/rawHttp';
import { BoxhostError, invalid, notFound, unauthenticated } from '../../core/errors';
import type { ApiContext, Identity } from '../context';
import { httpStatusOf } from './errorHandler';
import { admitCaller } from './rateLimit';
import { assertQueryEncoding, pathPattern } from './route';
import { prepareSession, SESSION_PATHS } from '../ws/sessions';

/**
 * The WebSocket routes, written the OpenAPI way (`/v1/projects/{project}/boxes/{name}/exec/ws`).
 * None is built yet (WebSocket exec and console come with their issue, DESIGN.md §4): a route
 * that mounts one with express-ws adds its path here, or its handshakes are refused with 404.
 */
export const websocketRoutes: string[] = [...SESSION_PATHS];


/** A handshake that passed `checkUpgrade`: who made it. */
export type UpgradeRequest = http.IncomingMessage & { identity?: Identity };

type UpgradeListener = (req: http.IncomingMessage, socket: Duplex, head: Buffer) => void;

/**
 * Whether a WebSocket handshake may go on to express-ws, or the contract's error to refuse it
 * with: counted by the rate limiter like any request, then 401 without a valid token (DESIGN.md
 * §6: "refused for auth answer 401, no upgrade"), then 404 for a path with no WebSocket route.
 * The token comes first so that a caller without one learns nothing about which paths exist.
 */
export async function checkUpgrade(api: ApiContext, req: http.IncomingMessage, routes: string[] = websocketRoutes): Promise<BoxhostError | null> {
  let identity = await admitCaller(api, req);
  // A browser's ticket (POST /v1/tickets) instead of a header: good for this one handshake.
  const ticket = new URL(req.url ?? '/', 'http://upgrade.invalid').searchParams.get('ticket');
  if (!identity && ticket === null) return unauthenticated();
  // Before a ticket is spent on a handshake that is refused for its query anyway.
  try {
    assertQueryEncoding(req.url);
  } catch (e) {
    return e as BoxhostError;
  }
  if (!identity) {
    identity = (await api.limits.tickets.redeem(ticket!)) ?? undefined;
    if (!identity) return unauthenticated('the ticket is unknown, used or expired');
  }
  (req as UpgradeRequest).identity = identity;
  let path: string;
  try {
    path = new URL(req.url ?? '/', 'http://upgrade.invalid').pathname;
    path.split('/').forEach((seg) => decodeURIComponent(seg));
  } catch {
    return invalid('the path is not valid percent-encoding', [{ field: 'path', issue: 'is not valid percent-encoded UTF-8' }]);
  }
  if (!routes.some((r) => pathPattern(r).test(path))) return notFound(`WebSocket route ${path}`);
  if (SESSION_PATHS.some((r) => pathPattern(r).test(path))) await prepareSession(api, req, identity);
  return null;
}

/** Answers a refused handshake on the raw socket: the status and the error body, no upgrade. */
function refuse(socket: Duplex, error: BoxhostError, requestId: string): void {
  endWithError(socket, httpStatusOf(error), error, { 'X-Request-Id': requestId });
}

/**
 * Puts the handshake check in front of whatever already listens for upgrades on `server`
 * (express-ws, which would otherwise answer 101 to any path and only then find no route): the
 * listeners are taken off and called only for a handshake `checkUpgrade` lets through. Call it
 * right after `expressWs(app, server)`.
 */
export function guardUpgrades(server: http.Server, api: ApiContext): void {
  const next = server.listeners('upgrade') as UpgradeListener[];
  server.removeAllListeners('upgrade');
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => undefined);
    const requestId = crypto.randomUUID();
    checkUpgrade(api, req)
      .then((refusal) => refusal ?? (next.length ? null : notFound('WebSocket route')))
      .catch((err: unknown) => {
        if (err instanceof BoxhostError && err.code !== 'internal') return err;
        api.log.error({ err, reqId: requestId }, 'websocket handshake check failed');
        return new BoxhostError('internal', `internal error (request id ${requestId})`);
      })
      .then((refusal) => {
        if (!refusal) {
          for (const listener of next) listener.call(server, req, socket, head);
          return;
        }
        // The path only: a query may carry a ticket once browsers connect with one.
        api.log.info({ reqId: requestId, path: (req.url ?? '').split('?')[0], status: httpStatusOf(refusal) }, 'websocket handshake refused');
        refuse(socket, refusal, requestId);
      });
  });
}
