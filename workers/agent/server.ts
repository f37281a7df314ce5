import crypto from 'node:crypto';
import http from 'node:http';
import express, { NextFunction, Request, Response } from 'express';
import type Joi from 'joi';
import { BoxhostError, invalid, notFound, statusOf, unauthenticated } from '../../core/errors';
import type { Logger } from '../../core/logger';
import { agentRoutes, BOX_ID_PATTERN, execRequestSchema, limitsSchema } from '../../cluster/protocol';
import type { LocalNode } from './localNode';
import { versionInfo } from '../../core/version';
import { listen, Listening } from '../../core/listen';
import type { ExecRequest } from '../../cluster/types';

export interface AgentOptions {
  node: LocalNode;
  secret: string;
  host: string;
  port: number;
  log: Logger;
  /** Whether a box id is one of this node's boxes (the db says). */
  holdsBox(boxId: string): Promise<boolean>;
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

const digest = (s: string) => crypto.createHash('sha256').update(s).digest();

/**
 * The node agent: the node's small internal HTTP endpoint for the calls that cannot wait in a
 * queue (exec now; the WebSocket, files and proxy calls join it later). Every request must
 * carry the cluster secret; boxes cannot reach it (the node's firewall chains refuse new
 * connections from box bridges to the host), and it answers only for this node's boxes.
 */
export async function startAgent(opts: AgentOptions): Promise<Agent> {
  const want = digest(opts.secret);
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
  // Exec answers its headers at once and the outcome in the body (`{result}` or `{error}`),
  // so the api tells a long exec from a hung node within seconds.
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
    res.flushHeaders();
    try {
      const stdin = body.stdin === undefined ? undefined : Buffer.from(body.stdin, 'base64');
      const result = await opts.node.exec(id, { ...body, stdin, signal: gone.signal });
      res.end(JSON.stringify({ result }));
    } catch (e) {
      res.end(JSON.stringify(toError(e, req.path, opts.log).toBody()));
    } finally {
      res.off('close', onClose);
    }
  });
  app.post(agentRoutes.limits, handle(async (req) => opts.node.updateLimits(await box(req), check(limitsSchema, req.body))));
  app.get(agentRoutes.snapshots, handle(async (req) => ({ snapshots: await opts.node.listSnapshots(await box(req)) })));

  app.use((req: Request, _res: Response, next: NextFunction) => next(notFound(`agent route ${req.method} ${req.path}`)));
  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    const e = toError(err, req.path, opts.log);
    res.status(statusOf(e.code)).json(e.toBody());
  });

  const server = http.createServer(app);
  server.keepAliveTimeout = 60_000;
  return listen(server, opts.port, opts.host);
}
