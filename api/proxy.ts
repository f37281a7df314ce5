import http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import { createProxyServer } from 'http-proxy-3';
import type { ApiContext } from './context';
import { bearer } from './http/route';
import { BoxhostError, invalid, notFound, statusOf, unauthenticated, unavailable } from '../core/errors';
import { listen, Listening } from '../core/listen';
import { endWithError } from '../core/rawHttp';
import { mayReach, proxyRoute, ProxyRoute, publishEvents } from '../domain/publishes';
import { authenticate, TOKEN_PREFIX } from '../domain/tokens';
import { sha256 } from '../core/ids';

/**
 * The publish proxy (docs/services.md "The proxy"): a request to
 * `<publish>--<box>--<project>.<publish domain>` goes to the box's address and published port, on
 * http-proxy-3 (HTTP, streamed bodies, SSE and WebSocket alike, X-Forwarded-* added). A
 * non-public publish needs a bearer token that reaches the project, and the token is taken off the
 * request before the box sees it. Errors are the contract's body: 404 nobody published that host,
 * 401 no token, 503 the box is not running, 502 nothing listens on the port.
 */

/** Routes are looked up at most this often per host (a stop or unpublish shows within it). */
const ROUTE_TTL_MS = 1000;

/** An http.Agent whose connections are opened by `open` (a node's tunnel to a box's port). */
class TunnelAgent extends http.Agent {
  constructor(private readonly open: () => Promise<Duplex>) {
    super({ keepAlive: true, maxSockets: 256 });
  }

  override createConnection(_options: unknown, cb: (err: Error | null, socket?: Duplex) => void): undefined {
    this.open().then(
      (s) => cb(null, s),
      (e: Error) => cb(e),
    );
    return undefined;
  }
}

/** An error the proxy answers 502 (the box, not the proxy, failed), with the code `unavailable`
 *  (the contract has no gateway code). */
const gateway = (e: BoxhostError) => Object.assign(e, { proxyStatus: 502 });

/** A publish of a box that is not running: 503, come back in a few seconds. */
const notRunning = (route: ProxyRoute) => new BoxhostError('unavailable', `box ${route.project}/${route.box} is ${route.status}; its publish answers again once it runs`, [], { 'Retry-After': '5' });

export interface ProxyServer extends Listening {
  port: number;
}

export async function startProxy(api: ApiContext, port: number, host: string): Promise<ProxyServer> {
  const suffix = `.${api.config.publishDomain.toLowerCase()}`;
  // Kept-alive connections to the boxes: a request costs no new TCP handshake.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });
  const proxy = createProxyServer({ xfwd: true, agent });
  // Every call below passes its own error callback; this catches what the library reports
  // outside of one (a client socket that resets mid-WebSocket): without it, it would throw.
  proxy.on('error', (_err, _req, res) => {
    if (res instanceof http.ServerResponse) send(res, unavailable('the proxied connection failed'));
    else (res as Duplex | undefined)?.destroy();
  });
  const routes = new Map<string, { at: number; route: Promise<ProxyRoute | null> }>();

  /**
   * A box on another machine is reached through its node (the agent's tunnel, cluster/types.ts
   * `tunnel`): one kept-alive agent per box port whose connections the node opens. A box of this
   * process's own node is dialled straight on the bridge.
   */
  const tunnels = new Map<string, http.Agent>();
  const agentFor = (route: ProxyRoute): http.Agent => {
    if (api.nodes.isLocal(route.node)) return agent;
    const key = `${route.node}/${route.boxId}/${route.address}/${route.port}`;
    let a = tunnels.get(key);
    if (!a) {
      a = new TunnelAgent(() => api.nodes.client(route.node).then((n) => n.tunnel(route.boxId, route.address!, route.port)));
      if (tunnels.size >= 1000) tunnels.delete(tunnels.keys().next().value!); // its sockets live on until they close
    } else tunnels.delete(key);
    tunnels.set(key, a); // the most recently used last
    return a;
  };

  const routeOf = (hostname: string): Promise<ProxyRoute | null> => {
    const hit = routes.get(hostname);
    if (hit && Date.now() - hit.at < ROUTE_TTL_MS) return hit.route;
    const route = proxyRoute(api, hostname);
    routes.set(hostname, { at: Date.now(), route });
    route.catch(() => routes.delete(hostname));
    if (routes.size > 10_000) routes.delete(routes.keys().next().value!);
    return route;
  };

  const forget = (h: string) => routes.delete(h);
  publishEvents.on('changed', forget);

  /** The target of a request, or the contract's error. */
  const resolve = async (req: http.IncomingMessage): Promise<{ route: ProxyRoute; target: string }> => {
    const hostname = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    const route = hostname.endsWith(suffix) ? await routeOf(hostname) : null;
    if (!route) throw notFound(`publish ${hostname || '(no Host header)'}`);
    const secret = bearer(req);
    // The box's service never sees a boxhost token, public publish or not.
    // (Tokens the api made by their prefix; the admin token, which may be any string, by its hash.)
    if (secret && (secret.startsWith(TOKEN_PREFIX) || sha256(secret) === api.adminTokenHash)) delete req.headers.authorization;
    if (!route.public) {
      const identity = secret ? await authenticate(api.db, api.adminTokenHash, secret) : null;
      if (!identity) throw unauthenticated(`publish ${hostname} is not public: send Authorization: Bearer <token>`);
      // A token that cannot see the project does not learn that the publish exists.
      if (!mayReach(identity, route.project)) throw notFound(`publish ${hostname}`);
    }
    if (route.status !== 'running' || !route.address) throw notRunning(route);
    return { route, target: `http://${route.address}:${route.port}` };
  };

  const notListening = (route: ProxyRoute) =>
    gateway(unavailable(`nothing answers on port ${route.port} in box ${route.project}/${route.box}${route.service ? ` (service ${route.service})` : ''}: is it listening on 0.0.0.0?`));

  /** The contract's error and the status the proxy answers it with. */
  const answerOf = (e: unknown): { err: BoxhostError; status: number; headers: Record<string, string> } => {
    const err = e instanceof BoxhostError ? e : unavailable('the proxy failed');
    const status = (e as { proxyStatus?: number }).proxyStatus ?? statusOf(err.code);
    return { err, status, headers: status === 401 ? { 'WWW-Authenticate': 'Bearer' } : {} };
  };

  const send = (res: http.ServerResponse, e: unknown) => {
    if (res.headersSent) return void res.destroy();
    const { err, status, headers } = answerOf(e);
    res.writeHead(status, { 'content-type': 'application/json', ...err.headers, ...headers });
    res.end(JSON.stringify(err.toBody()));
  };

  /** An error before the upgrade: an HTTP answer on the raw socket (after it, the socket is
   *  a WebSocket's and is only closed). */
  const refuse = (socket: Duplex, e: unknown) => {
    if ((socket as net.Socket).bytesWritten > 0) return void socket.destroy();
    const { err, status, headers } = answerOf(e);
    endWithError(socket, status, err, headers);
  };

  /**
   * Why a box did not answer: its route is read again past the cache, so a box that stopped (or a
   * publish that went) since is told as such (503, 404), not as a port nobody listens on (502).
   */
  const explain = async (route: ProxyRoute, err: Error): Promise<unknown> => {
    forget(route.host);
    const now = await proxyRoute(api, route.host).catch(() => route);
    if (!now) return notFound(`publish ${route.host}`);
    if (now.status !== 'running') return notRunning(now);
    if ((err as { refused?: boolean }).refused) return notListening(now);
    if (err instanceof BoxhostError) {
      // The node's own words stay in the log: the caller learns only that the way failed.
      api.log.warn({ host: now.host, node: now.node, err: err.message }, 'a tunnel to a box failed');
      const lost = unavailable(`box ${now.project}/${now.box} could not be reached through its node`);
      return err.code === 'unavailable' ? lost : gateway(lost);
    }
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ECONNREFUSED' || code === 'EHOSTUNREACH' || code === 'ETIMEDOUT') return notListening(now);
    return gateway(unavailable(`the answer of box ${now.project}/${now.box} broke off: ${err.message}`));
  };

  const server = http.createServer((req, res) => {
    resolve(req)
      .then(({ route, target }) => proxy.web(req, res, { target, agent: agentFor(route) }, (err) => void explain(route, err as Error).then((e) => send(res, e))))
      // A request the library cannot take (a bad absolute URL in the request line) throws here.
      .catch((e) => send(res, e instanceof BoxhostError ? e : invalid('the proxy cannot forward this request')));
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => undefined);
    resolve(req)
      .then(({ route, target }) => proxy.ws(req, socket, head, { target, agent: agentFor(route) }, (err) => void explain(route, err as Error).then((e) => refuse(socket, e))))
      .catch((e) => refuse(socket, e));
  });
  // Nothing here times out on its own: an SSE stream or a WebSocket lives as long as both ends do.
  server.requestTimeout = 0;
  const listening = await listen(server, port, host);
  return {
    url: listening.url,
    port: Number(new URL(listening.url).port),
    close: async () => {
      publishEvents.off('changed', forget);
      await listening.close();
      agent.destroy();
      for (const a of tunnels.values()) a.destroy();
      proxy.close();
    },
  };
}
