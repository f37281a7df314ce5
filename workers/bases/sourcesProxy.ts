import dns from 'node:dns';
import http from 'node:http';
import type net from 'node:net';
import type { AddressInfo } from 'node:net';
import { inCidr } from '../../core/netblocks';

/** A package source as the proxy lets it through: an http host name and port. */
export interface SourceEndpoint {
  host: string;
  port: number;
}

export interface SourcesProxyOptions {
  /** The sources allowed (read again at most every few seconds). */
  endpoints: () => SourceEndpoint[];
  /** Addresses or IPv4 CIDRs the proxy never connects to, whatever a source resolves to
   *  (link-local, the box subnet, the platform's Redis and PostgreSQL, BOXHOST_PROTECTED_NETS). */
  refused?: () => Promise<string[]>;
  /** Where a refused or failed request is told. */
  log?: { warn(obj: object, msg: string): void };
  /** Test seam: the address it listens on (default: every address, port chosen by the kernel). */
  listenHost?: string;
}

/** Headers a proxy never passes on (hop-by-hop, and the proxy's own). */
const HOP = new Set(['connection', 'proxy-connection', 'proxy-authorization', 'keep-alive', 'te', 'trailer', 'transfer-encoding', 'upgrade']);
/** How long a source may take to answer with its headers. */
const HEADERS_TIMEOUT_MS = 60_000;
/** Connections at once, all boxes together, and requests at once per box. */
const MAX_CONNECTIONS = 256;
const MAX_REQUESTS_PER_BOX = 32;
const ENDPOINTS_TTL_MS = 5_000;
const noop = () => undefined;

const plain = (address: string | undefined) => (address ?? '').replace(/^::ffff:/, '');

/**
 * The node's package-source proxy (docs/bases.md "Builds reach the package sources"): what a
 * base build's box reaches its Debian package sources through while its script runs, by name.
 * A plain HTTP forward proxy that serves only the boxes let in (`allow`, by address: any other
 * peer is cut at its first byte) and only bodiless GET and HEAD of `http://<source host>[:port]/…`
 * for the node's sources; everything else is refused (another host, port or method, a body,
 * CONNECT — a tunnel would carry TLS for any site the source's CDN serves). The node resolves
 * the name, never to a refused destination, so boxes need no DNS; Debian's archives are http,
 * their integrity is apt's signed Release files.
 */
export class SourcesProxy {
  private server?: http.Server;
  private listening?: Promise<number>;
  /** Box address → box id, for the boxes whose scripts run now. */
  private readonly boxes = new Map<string, string>();
  private readonly inFlight = new Map<string, number>();
  private endpointsCache?: { at: number; value: SourceEndpoint[] };

  constructor(private readonly o: SourcesProxyOptions) {}

  /** Lets the box at `address` in; answers the port the proxy listens on (started at first use). */
  async allow(boxId: string, address: string): Promise<number> {
    this.boxes.set(address, boxId);
    return this.start();
  }

  disallow(boxId: string): void {
    for (const [address, id] of this.boxes) if (id === boxId) this.boxes.delete(address);
  }

  async close(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    this.listening = undefined;
    if (!s) return;
    const closed = new Promise<void>((resolve) => s.close(() => resolve()));
    s.closeAllConnections();
    await closed;
  }

  private start(): Promise<number> {
    if (this.listening) return this.listening;
    const server = http.createServer({ requestTimeout: 0, headersTimeout: 30_000 }, (req, res) => this.forward(req, res));
    server.maxConnections = MAX_CONNECTIONS;
    server.on('connection', (socket: net.Socket) => {
      socket.on('error', noop);
      // Anyone but a box let in is cut before a byte is read.
      if (!this.boxes.has(plain(socket.remoteAddress))) socket.destroy();
    });
    server.on('connect', (req, socket) => {
      socket.on('error', noop);
      this.refuse(req, 'CONNECT is not proxied');
      socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n', () => socket.destroy());
      setTimeout(() => socket.destroy(), 1000).unref();
    });
    server.on('clientError', (_e, socket) => socket.destroy());
    this.server = server;
    this.listening = new Promise<number>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, this.o.listenHost ?? '0.0.0.0', () => resolve((server.address() as AddressInfo).port));
    });
    this.listening.catch(() => (this.listening = undefined));
    return this.listening;
  }

  private endpoints(): SourceEndpoint[] {
    if (!this.endpointsCache || Date.now() - this.endpointsCache.at > ENDPOINTS_TTL_MS) this.endpointsCache = { at: Date.now(), value: this.o.endpoints() };
    return this.endpointsCache.value;
  }

  private refuse(req: http.IncomingMessage, why: string): void {
    this.o.log?.warn({ from: plain(req.socket.remoteAddress), method: req.method, url: String(req.url).slice(0, 200) }, `package-source proxy refused: ${why}`);
  }

  /** Whether a request may go on: its target, or why not. */
  check(req: Pick<http.IncomingMessage, 'method' | 'url' | 'headers'> & { socket: { remoteAddress?: string } }): { target: URL } | { refused: string } {
    if (!this.boxes.has(plain(req.socket.remoteAddress))) return { refused: 'not a build box whose script runs now' };
    if (req.method !== 'GET' && req.method !== 'HEAD') return { refused: `method ${req.method}` };
    const length = req.headers['content-length'];
    if (req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0')) return { refused: 'a request with a body' };
    let u: URL;
    try {
      u = new URL(req.url ?? '');
    } catch {
      return { refused: 'not an absolute http URL' };
    }
    if (u.protocol !== 'http:' || u.username || u.password) return { refused: 'not a plain http URL' };
    const port = u.port ? Number(u.port) : 80;
    if (!this.endpoints().some((e) => e.host.toLowerCase() === u.hostname.toLowerCase() && e.port === port)) return { refused: `${u.hostname}:${port} is not a package source of this node` };
    return { target: u };
  }

  /** The node's resolver, never answering a refused destination. */
  private lookup: net.LookupFunction = (host, options, callback) => {
    dns.lookup(host, { family: 4, all: true }, (err, addresses) => {
      if (err) return void callback(err, '', 4);
      const found = addresses as dns.LookupAddress[];
      void (this.o.refused ? this.o.refused() : Promise.resolve([] as string[])).then(
        (refused) => {
          const ok = found.filter((a) => !refused.some((r) => inCidr(a.address, r)));
          if (ok.length === 0) return void callback(Object.assign(new Error(`${host} resolves only to destinations boxes never reach`), { code: 'EREFUSED' }), '', 4);
          if ((options as dns.LookupOptions).all) callback(null, ok as unknown as string, 4);
          else callback(null, ok[0].address, 4);
        },
        (e: Error) => callback(e, '', 4),
      );
    });
  };

  private forward(req: http.IncomingMessage, res: http.ServerResponse): void {
    res.on('error', noop);
    let verdict: ReturnType<SourcesProxy['check']>;
    try {
      verdict = this.check(req);
    } catch (e) {
      this.o.log?.warn({ err: (e as Error).message }, 'package-source proxy: the node could not read its package sources');
      res.writeHead(502, { 'content-type': 'text/plain', connection: 'close' }).end('boxhost: the node could not read its package sources\n');
      return;
    }
    if ('refused' in verdict) {
      this.refuse(req, verdict.refused);
      res.writeHead(403, { 'content-type': 'text/plain', connection: 'close' }).end(`boxhost: ${verdict.refused}\n`);
      return;
    }
    const from = plain(req.socket.remoteAddress);
    const busy = this.inFlight.get(from) ?? 0;
    if (busy >= MAX_REQUESTS_PER_BOX) {
      res.writeHead(429, { 'content-type': 'text/plain', connection: 'close' }).end('boxhost: too many requests at once\n');
      return;
    }
    this.inFlight.set(from, busy + 1);
    res.on('close', () => {
      const n = (this.inFlight.get(from) ?? 1) - 1;
      if (n > 0) this.inFlight.set(from, n);
      else this.inFlight.delete(from);
    });
    const u = verdict.target;
    const headers: http.OutgoingHttpHeaders = {};
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && k !== 'content-length' && v !== undefined) headers[k] = v;
    headers.host = u.host;
    let done = false;
    const up = http.request({ host: u.hostname, port: u.port ? Number(u.port) : 80, path: `${u.pathname}${u.search}`, method: req.method, headers, lookup: this.lookup }, (upRes) => {
      clearTimeout(timer);
      const out: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(upRes.headers)) if (!HOP.has(k) && v !== undefined) out[k] = v;
      res.writeHead(upRes.statusCode ?? 502, out);
      upRes.on('error', () => res.destroy());
      upRes.on('end', () => (done = true));
      upRes.pipe(res);
    });
    // Only until the headers: a response queued behind a pipelined one is not idle.
    const timer = setTimeout(() => up.destroy(new Error('the package source did not answer')), HEADERS_TIMEOUT_MS);
    up.on('error', (e) => {
      clearTimeout(timer);
      this.o.log?.warn({ host: u.hostname, err: e.message }, 'package-source proxy: upstream failed');
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end('boxhost: the package source could not be reached\n');
      else res.destroy();
    });
    // The box went away first: the upstream request goes too.
    res.on('close', () => {
      clearTimeout(timer);
      if (!done) up.destroy();
    });
    up.end();
  }
}
