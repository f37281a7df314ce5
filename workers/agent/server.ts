import crypto from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import express, { NextFunction, Request, Response } from 'express';
import type Joi from 'joi';
import { BoxhostError, invalid, notFound, statusOf, unauthenticated, unavailable } from '../../core/errors';
import type { Logger } from '../../core/logger';
import type { Duplex } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { pipeReleasing } from '../../core/bufferLease';
import { Server as WebSocketServer } from 'ws';
import { agentRoutes, baseRefSchema, stagingTokenSchema, BOX_ID_PATTERN, execRequestSchema, execSessionSchema, FILE_STAT_HEADER, limitsSchema, serviceCallSchema, snapshotNameSchema, TUNNEL_PROTOCOL } from '../../cluster/protocol';
import { bridgeSession } from '../../cluster/wsSession';
import type { LocalNode } from './localNode';
import { versionInfo } from '../../core/version';
import { HTTP_BUFFER_BYTES, listen, Listening } from '../../core/listen';
import { endWithError } from '../../core/rawHttp';
import type { ExecRequest, ExecSessionRequest, NodeServiceSpec, ServiceGate } from '../../cluster/types';

export interface AgentOptions {
  node: LocalNode;
  secret: string;
  host: string;
  port: number;
  log: Logger;
  /** Whether a box id is one of this node's boxes (the db says). */
  holdsBox(boxId: string): Promise<boolean>;
  /** The box's address on this node's bridge (the db says); a tunnel goes only there. Without
   *  it, the agent opens no tunnel. */
  addressOf?(boxId: string): Promise<string | null>;
}

export type Agent = Listening;

/** The contract's error for anything thrown; an unexpected one is logged here in full and
 *  answered without its text (host command lines and paths stay on the node). */
function toError(err: unknown, path: string, log: Logger): BoxhostError {
  if (err instanceof BoxhostError && err.code !== 'internal') return err;
  if ((err as { type?: string })?.type === 'entity.parse.failed') return invalid('the body is not valid JSON');
  const ref = crypto.randomUUID();
  log.error({ err, path, ref }, 'agent call failed');
  return new BoxhostError('internal', `internal error on the node (ref ${ref})`);
}

/**
 * A box this node holds is believed held for HELD_MS after the db said so: each call into a box
 * (an exec most of all) then costs no db read. A box leaves a node only by being deleted or
 * forgotten with it, and a call that comes within that second finds no container or agent and
 * fails as for any box that stopped. Answers of "not held" are never kept.
 */
const HELD_MS = 1000;

function heldFor(ms: number, holds: (id: string) => Promise<boolean>): (id: string) => Promise<boolean> {
  const until = new Map<string, number>();
  return async (id) => {
    const t = until.get(id);
    if (t !== undefined && t > Date.now()) return true;
    const held = await holds(id);
    if (held) {
      if (until.size >= 10_000) until.clear();
      until.set(id, Date.now() + ms);
    } else until.delete(id);
    return held;
  };
}

/** How long an exec runs before the agent sends its answer's headers alone (see the exec route). */
const EXEC_HEADERS_MS = 250;

const digest = (s: string) => crypto.createHash('sha256').update(s).digest();

/**
 * The node agent: the node's small internal HTTP endpoint for the calls that cannot wait in a
 * queue (exec now; the WebSocket, files and proxy calls join it later). Every request must
 * carry the cluster secret; boxes cannot reach it (the node's firewall chains refuse new
 * connections from box bridges to the host), and it answers only for this node's boxes.
 */
export async function startAgent(opts: AgentOptions): Promise<Agent> {
  const want = digest(opts.secret);
  opts = { ...opts, holdsBox: heldFor(HELD_MS, opts.holdsBox) };
  const app = express();
  app.disable('x-powered-by');

  app.use((req: Request, _res: Response, next: NextFunction) => {
    const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
    if (!m || !crypto.timingSafeEqual(digest(m[1]), want)) return next(unauthenticated('the cluster secret is missing or wrong'));
    next();
  });
  app.use(express.json({ limit: '64mb' }));

  const box = async (req: Request): Promise<string> => {
    const id = String(req.params.boxId);
    if (!BOX_ID_PATTERN.test(id) || !(await opts.holdsBox(id))) throw notFound(`box ${id} on node ${opts.node.nodeId}`);
    return id;
  };
  const check = <T>(schema: Joi.Schema<T>, body: unknown): T => {
    const { value, error } = schema.validate(body ?? {});
    if (error) throw invalid(`invalid agent request: ${error.message}`);
    return value;
  };
  const handle = (fn: (req: Request) => Promise<unknown>) => async (req: Request, res: Response, next: NextFunction) => {
    try {
      const out = await fn(req);
      if (out === undefined) res.status(204).end();
      else res.json(out);
    } catch (e) {
      next(e);
    }
  };

  app.get(agentRoutes.health, handle(async () => ({ node: opts.node.nodeId, version: versionInfo().version, storage: await opts.node.storageHealth() })));
  // Exec answers its headers within EXEC_HEADERS_MS and the outcome in the body (`{result}` or
  // `{error}`), so the api tells a long exec from a hung node within seconds.
  app.post(agentRoutes.exec, async (req: Request, res: Response, next: NextFunction) => {
    let id: string;
    let body: Omit<ExecRequest, 'stdin'> & { stdin?: string };
    try {
      id = await box(req);
      body = check(execRequestSchema, req.body);
    } catch (e) {
      return next(e);
    }
    // The api closes its request when its own client went away (or it gave up): the command
    // ends with it. A detached exec has nothing left to end once started.
    const gone = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) gone.abort();
    };
    res.on('close', onClose);
    res.status(200).setHeader('content-type', 'application/json');
    // The headers go out on their own only for an exec still running after EXEC_HEADERS_MS
    // (well inside the api's 5 s ack wait); a short one answers headers and outcome in one
    // write, one packet and one wake-up of the api fewer.
    const flush = setTimeout(() => res.flushHeaders(), EXEC_HEADERS_MS);
    try {
      const stdin = body.stdin === undefined ? undefined : Buffer.from(body.stdin, 'base64');
      const result = await opts.node.exec(id, { ...body, stdin, signal: gone.signal });
      res.end(JSON.stringify({ result }));
    } catch (e) {
      res.end(JSON.stringify(toError(e, req.path, opts.log).toBody()));
    } finally {
      clearTimeout(flush);
      res.off('close', onClose);
    }
  });
  app.post(agentRoutes.limits, handle(async (req) => opts.node.updateLimits(await box(req), check(limitsSchema, req.body))));
  app.get(agentRoutes.snapshots, handle(async (req) => ({ snapshots: await opts.node.listSnapshots(await box(req)) })));
  app.delete(agentRoutes.snapshots, handle(async (req) => opts.node.deleteSnapshot(await box(req), check(snapshotNameSchema, req.query.name))));
  app.get(agentRoutes.volumeInfo, handle(async (req) => {
    const id = String(req.params.volumeId);
    if (!/^v[a-z0-9]{1,31}$/.test(id)) throw invalid('not a volume id');
    return opts.node.volumeInfo(id);
  }));
  app.get(agentRoutes.snapshotBlockers, handle(async (req) => opts.node.restoreBlockers(await box(req), check(snapshotNameSchema, req.query.name))));

  // Files: the path in `?path=`; bytes stream both ways (docs/files.md).
  const pathOf = (req: Request): string => {
    const p = req.query.path;
    if (typeof p !== 'string' || !p.startsWith('/')) throw invalid('path must be an absolute path', [{ field: 'path', issue: 'must be an absolute path' }]);
    return p;
  };
  app.get(agentRoutes.fileStat, handle(async (req) => opts.node.fileStat(await box(req), pathOf(req))));
  app.get(agentRoutes.fileList, handle(async (req) => opts.node.fileList(await box(req), pathOf(req))));
  app.delete(agentRoutes.files, handle(async (req) => opts.node.fileDelete(await box(req), pathOf(req), req.query.recursive === 'true')));
  app.get(agentRoutes.files, async (req: Request, res: Response, next: NextFunction) => {
    try {
      const { stat, data } = await opts.node.fileRead(await box(req), pathOf(req));
      // The api may have gone while the file was opened: nothing would ever read it.
      if (res.destroyed) return void data.destroy();
      res.status(200).setHeader('content-type', 'application/octet-stream');
      res.setHeader(FILE_STAT_HEADER, Buffer.from(JSON.stringify(stat)).toString('base64url'));
      // Pieces released once the socket has them: the read buffers are used again (core/bufferLease.ts).
      await pipeReleasing(data, res).catch(() => res.destroy());
    } catch (e) {
      next(e);
    }
  });
  app.put(agentRoutes.files, handle(async (req) => {
    const mode = typeof req.query.mode === 'string' && /^[0-7]{1,4}$/.test(req.query.mode) ? parseInt(req.query.mode, 8) : undefined;
    return opts.node.fileWrite(await box(req), pathOf(req), req, mode);
  }));

  // Bases: an upload staged and checked on this node's disk, an export streamed, a copy dropped.
  app.put(agentRoutes.baseImports, handle(async (req) => opts.node.stageBaseImport(req)));
  app.delete(agentRoutes.baseImports, handle(async (req) => opts.node.discardStagedImport(check(stagingTokenSchema, req.query.token))));
  app.delete(agentRoutes.bases, handle(async (req) => opts.node.destroyBase(check(baseRefSchema, req.query))));
  app.get(agentRoutes.bases, async (req: Request, res: Response, next: NextFunction) => {
    try {
      const data = await opts.node.exportBase(check(baseRefSchema, req.query));
      if (res.destroyed) return void data.destroy();
      res.status(200).setHeader('content-type', 'application/x-tar');
      await pipeline(data, res).catch(() => res.destroy());
    } catch (e) {
      next(e);
    }
  });

  // Services: one call route (the op says which), and the log streamed.
  app.post(agentRoutes.services, handle(async (req) => {
    const id = await box(req);
    const call = check(serviceCallSchema, req.body) as { op: string; name: string; spec: NodeServiceSpec; gate?: ServiceGate; action: 'start' | 'stop' | 'restart'; signal?: string; graceMs?: number };
    switch (call.op) {
      case 'start':
        return opts.node.serviceStart(id, call.spec, call.gate);
      case 'list':
        return { services: await opts.node.serviceList(id) };
      case 'get':
        return opts.node.serviceGet(id, call.name);
      case 'control':
        return opts.node.serviceControl(id, call.name, call.action, { signal: call.signal, graceMs: call.graceMs });
      default:
        return opts.node.serviceDelete(id, call.name);
    }
  }));
  app.get(agentRoutes.serviceLogs, async (req: Request, res: Response, next: NextFunction) => {
    try {
      const id = await box(req);
      const name = typeof req.query.name === 'string' ? req.query.name : '';
      const tail = typeof req.query.tail === 'string' && /^\d{1,5}$/.test(req.query.tail) ? Number(req.query.tail) : undefined;
      const data = await opts.node.serviceLogs(id, name, { tail, follow: req.query.follow === 'true' });
      if (res.destroyed) return void data.destroy();
      res.status(200).setHeader('content-type', 'text/plain; charset=utf-8');
      res.flushHeaders();
      await pipeline(data, res).catch(() => res.destroy());
    } catch (e) {
      next(e);
    }
  });

  app.use((req: Request, _res: Response, next: NextFunction) => next(notFound(`agent route ${req.method} ${req.path}`)));
  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    const e = toError(err, req.path, opts.log);
    res.status(statusOf(e.code)).json(e.toBody());
  });

  const server = http.createServer({ highWaterMark: HTTP_BUFFER_BYTES }, app);
  server.keepAliveTimeout = 60_000;
  // A file upload takes as long as it takes (its idle time is bounded by the api's client).
  server.requestTimeout = 0;
  acceptSessions(server, opts, want);
  return listen(server, opts.port, opts.host);
}

const EXEC_WS_RE = new RegExp(`^${agentRoutes.execWs.replace(':boxId', '([a-z0-9]{1,32})')}$`);
const TUNNEL_RE = new RegExp(`^${agentRoutes.tunnel.replace(':boxId', '([a-z0-9]{1,32})')}$`);

/**
 * WebSocket sessions (the api's WebSocket exec and console on this node): the cluster secret
 * and the box checked before the upgrade; then the first message is the request, the process is
 * started and `{"ok": true}` (or the error body) answered, and the session is relayed
 * (cluster/wsSession.ts).
 */
function acceptSessions(server: http.Server, opts: AgentOptions, want: Buffer): void {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 16 << 20 });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => undefined);
    const refuse = (e: BoxhostError, status = statusOf(e.code)) => endWithError(socket, status, e);
    void (async () => {
      const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
      if (!m || !crypto.timingSafeEqual(digest(m[1]), want)) return refuse(unauthenticated('the cluster secret is missing or wrong'));
      const [pathname, search] = (req.url ?? '').split('?');
      if (String(req.headers.upgrade).toLowerCase() === TUNNEL_PROTOCOL) return tunnel(req, socket, head, TUNNEL_RE.exec(pathname)?.[1], new URLSearchParams(search ?? ''), opts, refuse);
      const route = EXEC_WS_RE.exec(pathname);
      if (!route) return refuse(notFound(`agent WebSocket route ${req.url}`));
      const boxId = route[1];
      if (!(await opts.holdsBox(boxId))) return refuse(notFound(`box ${boxId} on node ${opts.node.nodeId}`));
      wss.handleUpgrade(req, socket, head, (ws) => {
        ws.once('message', async (data: Buffer) => {
          try {
            const { value, error } = execSessionSchema.validate(JSON.parse(data.toString('utf8')));
            if (error) throw invalid(`invalid session request: ${error.message}`);
            const session = await opts.node.execSession(boxId, value as ExecSessionRequest);
            if (ws.readyState !== ws.OPEN) return session.close();
            ws.send(JSON.stringify({ ok: true }));
            bridgeSession(ws, session);
          } catch (e) {
            ws.send(JSON.stringify(toError(e, req.url ?? '', opts.log).toBody()), () => ws.close(1000));
          }
        });
      });
    })().catch((e) => refuse(toError(e, req.url ?? '', opts.log)));
  });
}

/**
 * A tunnel for the publish proxy: the box checked to be this node's, a TCP connection opened to
 * its port, then 101 and bytes both ways until either end closes. Nothing listening → 502.
 */
async function tunnel(req: http.IncomingMessage, socket: Duplex, head: Buffer, boxId: string | undefined, q: URLSearchParams, opts: AgentOptions, refuse: (e: BoxhostError, status?: number) => void): Promise<void> {
  const address = q.get('address') ?? '';
  const port = Number(q.get('port'));
  if (!boxId) return refuse(notFound(`agent tunnel route ${req.url}`));
  if (!net.isIPv4(address) || !Number.isInteger(port) || port < 1 || port > 65535) return refuse(invalid('a tunnel needs an IPv4 address and a port'));
  if (!(await opts.holdsBox(boxId))) return refuse(notFound(`box ${boxId} on node ${opts.node.nodeId}`));
  // Only to the box's own address: the node dials as root from outside the boxes' firewall, so
  // an address the caller names (the node's localhost, another box's) is refused.
  if (!opts.addressOf || (await opts.addressOf(boxId)) !== address) return refuse(invalid(`${address} is not the address of box ${boxId}`));
  let box: Duplex;
  try {
    box = await opts.node.tunnel(boxId, address, port);
  } catch (e) {
    return refuse(e instanceof BoxhostError ? e : unavailable((e as Error).message), (e as { refused?: boolean }).refused ? 502 : undefined);
  }
  if (socket.destroyed) return void box.destroy();
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_PROTOCOL}\r\n\r\n`);
  if (head.length) box.write(head);
  // Either end going takes the other with it.
  box.on('error', () => socket.destroy());
  socket.on('error', () => box.destroy());
  box.on('close', () => socket.destroy());
  socket.on('close', () => box.destroy());
  box.pipe(socket);
  socket.pipe(box);
}
