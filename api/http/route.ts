import { isUtf8 } from 'node:buffer';
import express, { NextFunction, Request, Response, Router } from 'express';
import Joi from 'joi';
import YAML from 'yaml';
import type { ApiContext } from '../context';
import type { Identity } from '../../domain/context';
import { authenticate } from '../../domain/tokens';
import { BoxhostError, forbidden, invalid, notFound, unauthenticated } from '../../core/errors';
import { NotUnicodeError, ProtoKeyError, StatusError } from './errorHandler';

export type Method = 'get' | 'post' | 'put' | 'patch' | 'delete';

/** Who may call a route: nobody needs a token (`public`), any valid token (`token`), or a
 *  token that is not limited to projects (`admin`). */
export type Access = 'public' | 'token' | 'admin';

export interface Reply {
  status?: number;
  body?: unknown;
  headers?: Record<string, string>;
}

export interface RouteContext<B = any, Q = any, P = any> {
  req: Request;
  res: Response;
  body: B;
  query: Q;
  params: P;
  /** Set on every route whose access is not `public`. */
  identity: Identity;
  api: ApiContext;
}

export interface ResponseDoc {
  description: string;
  schema?: Joi.Schema;
}

/**
 * One route: its schemas (validation and the OpenAPI entry come from them), who may call it,
 * and a thin handler. `path` is written the OpenAPI way (`/v1/tokens/{id}`).
 */
export interface RouteDef<B = any, Q = any, P = any> {
  method: Method;
  path: string;
  summary: string;
  tag: string;
  access?: Access;
  params?: Joi.ObjectSchema<P>;
  query?: Joi.ObjectSchema<Q>;
  body?: Joi.Schema<B>;
  /** JSON body limit (default 1 MiB). */
  bodyLimit?: string;
  /** The route reads the raw request stream itself (no JSON parsing). */
  rawBody?: boolean;
  /** A YAML body (Content-Type application/yaml, text/yaml, their x- forms) is taken too, parsed
   *  into the same value a JSON body gives, then validated the same way. */
  yaml?: boolean;
  responses: Record<number, ResponseDoc>;
  handler(ctx: RouteContext<B, Q, P>): Promise<Reply | void>;
}

export const defineRoute = <B = any, Q = any, P = any>(def: RouteDef<B, Q, P>): RouteDef<B, Q, P> => def;

export const expressPath = (path: string) => path.replace(/\{(\w+)\}/g, ':$1');

/** A route's path written the OpenAPI way as a regular expression over a request's path,
 *  matched as express matches it (any case, a trailing slash allowed). */
export const pathPattern = (path: string) =>
  new RegExp(`^${path.split('/').map((seg) => (/^\{\w+\}$/.test(seg) ? '[^/]+' : seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))).join('/')}/?$`, 'i');

/**
 * Joi failures become 400 with one `{field, issue}` per failed field. A path or query value is
 * text and is converted to the type its schema names (`?wait=30`); a body's value must already
 * be that type: `"port": "80"` is a string where the spec says integer, refused, not converted
 * (docs/decisions.md "Requests and errors"). A body schema that normalises text (a lowercased
 * domain) says so with `.prefs({ convert: true })` on that field.
 */
export function validate<T>(schema: Joi.Schema<T> | undefined, value: unknown, where: 'path' | 'query' | 'body'): T {
  if (!schema) return value as T;
  const { value: out, error } = schema.validate(value, { abortEarly: false, convert: where !== 'body' });
  if (error) {
    const details = error.details.map((d) => ({
      field: d.path.length ? d.path.join('.') : where,
      issue: d.message.replace(/^"[^"]*" /, ''),
    }));
    throw invalid(`invalid ${where}: ${details.map((d) => `${d.field} ${d.issue}`).join('; ')}`, details);
  }
  return out as T;
}

/** The `charset` parameter of a Content-Type header, lowercased (undefined when absent). */
function charsetOf(contentType: string | undefined): string | undefined {
  const m = /;\s*charset\s*=\s*(?:"([^"]*)"|([^;\s]*))/i.exec(contentType ?? '');
  return m ? (m[1] ?? m[2]).toLowerCase() : undefined;
}

/**
 * JSON bodies are UTF-8 (RFC 8259 §8.1): any other declared charset is refused with 415 before
 * the body is read, rather than decoded into something the client did not mean.
 */
const utf8Only: express.RequestHandler = (req, _res, next) => {
  const charset = charsetOf(req.headers['content-type']);
  if (charset === undefined || charset === 'utf-8' || charset === 'utf8') return next();
  next(new StatusError(415, 'invalid_argument', `the body's charset ${JSON.stringify(charset)} is not supported: JSON bodies are UTF-8`, [
    { field: 'content-type', issue: 'charset must be utf-8' },
  ]));
};

const YAML_TYPES = ['application/yaml', 'application/x-yaml', 'text/yaml', 'text/x-yaml'];

/** A Content-Type's media type, lowercased, without its parameters. */
const mediaType = (contentType: string | undefined) => (contentType ?? '').split(';')[0].trim().toLowerCase();

/** A YAML body becomes the value JSON would have given: no custom tags, aliases bounded (a
 *  "billion laughs" document is refused), one document. */
const parseYamlBody: express.RequestHandler = (req, _res, next) => {
  if (typeof req.body !== 'string' || !req.is(YAML_TYPES)) return next();
  try {
    // No tag beyond plain JSON's values: !!binary, !!timestamp, !!set and the like would give
    // Buffers, Dates and Maps that a schema takes for empty objects.
    const doc = YAML.parseDocument(req.body, { schema: 'core', uniqueKeys: true, resolveKnownTags: false });
    if (doc.errors.length > 0) throw doc.errors[0];
    if (doc.warnings.length > 0) throw doc.warnings[0];
    const value = doc.toJS({ maxAliasCount: 100 }) as unknown;
    // Aliases can make a small document large: the JSON limit holds for what it means, counted
    // while it is walked (never built first).
    plainTree(value, '', { bytes: 0 });
    req.body = value ?? {};
    next();
  } catch (e) {
    next(e instanceof StatusError || e instanceof NotUnicodeError || e instanceof ProtoKeyError || e instanceof BoxhostError ? e : invalid(`the body is not valid YAML: ${(e as Error).message.split('\n')[0]}`, [{ field: 'body', issue: 'is not valid YAML' }]));
  }
};

const YAML_MAX_BYTES = 1024 * 1024;

/** Only what JSON could have said (plain objects, arrays, strings, finite numbers, booleans,
 *  null), every string well-formed Unicode. */
function plainTree(v: unknown, key: string, size: { bytes: number }): void {
  wellFormed(key, typeof v === 'string' ? v : undefined);
  size.bytes += key.length + 4 + (typeof v === 'string' ? v.length : 8);
  if (size.bytes > YAML_MAX_BYTES) throw new StatusError(413, 'payload_too_large', 'the YAML body means more than 1 MiB of JSON');
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return;
  if (typeof v === 'number' && Number.isFinite(v)) return;
  if (Array.isArray(v)) return v.forEach((x) => plainTree(x, '', size));
  if (typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype) {
    for (const [k, x] of Object.entries(v as object)) plainTree(x, k, size);
    return;
  }
  throw invalid(`the YAML body holds a value JSON cannot (${key ? `at ${key}` : 'a tagged or special value'})`, [{ field: key || 'body', issue: 'not a plain JSON value' }]);
}

/** Bytes that are not UTF-8 are refused (400) instead of being stored as U+FFFD. */
function verifyUtf8(_req: unknown, _res: unknown, buf: Buffer): void {
  if (!isUtf8(buf)) throw invalid('the body is not valid UTF-8', [{ field: 'body', issue: 'is not valid UTF-8' }]);
}

/** A lone surrogate (`"\ud800"`) is JSON but no text: it would not survive a round trip through
 *  the database either, so it is refused like invalid UTF-8. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
export function wellFormed(key: string, value: unknown): unknown {
  if (key === '__proto__') throw new ProtoKeyError('a key named __proto__');
  if (LONE_SURROGATE.test(key) || (typeof value === 'string' && LONE_SURROGATE.test(value))) {
    throw new NotUnicodeError('a string is not valid Unicode');
  }
  return value;
}

/**
 * A query whose percent-encoding is broken (`?path=%zz`, `%C3%28`) is refused: express's parser
 * would hand on the raw text, and a file named `a%zzb` would be written where the caller meant
 * something else. Checked after the caller is known, so a caller without a token hears 401 first.
 */
export function assertQueryEncoding(url: string | undefined): void {
  const at = (url ?? '').indexOf('?');
  if (at < 0) return;
  for (const part of url!.slice(at + 1).split('&')) {
    for (const piece of part.split('=')) {
      try {
        decodeURIComponent(piece.replace(/\+/g, ' '));
      } catch {
        throw invalid('the query is not valid percent-encoding', [{ field: 'query', issue: 'is not valid percent-encoded UTF-8' }]);
      }
    }
  }
}

export function bearer(req: { headers: { authorization?: string } }): string | undefined {
  const h = req.headers.authorization;
  if (!h) return undefined;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  return m ? m[1] : undefined;
}

export async function identify(api: ApiContext, req: Request): Promise<Identity> {
  // The rate limiter (api/http/rateLimit.ts) has authenticated the request already.
  const known = (req.res?.locals as { identity?: Identity } | undefined)?.identity;
  if (known) return known;
  const secret = bearer(req);
  if (!secret) throw unauthenticated();
  const identity = await authenticate(api.db, api.adminTokenHash, secret);
  if (!identity) throw unauthenticated('the bearer token is unknown, revoked or expired');
  return identity;
}

/** Mounts every route on a router: auth, body parsing, validation, then the handler's reply. The
 *  caller is known before its body is read: one without a valid token hears 401, not what is
 *  wrong with its body (413, 400), and costs no parse. */
export function mountRoutes(api: ApiContext, routes: RouteDef[]): Router {
  const router = express.Router();
  for (const def of routes) {
    const handlers: express.RequestHandler[] = [];
    if ((def.access ?? 'token') !== 'public') {
      handlers.push(async (req: Request, res: Response, next: NextFunction) => {
        try {
          const identity = await identify(api, req);
          res.locals.identity = identity;
          if (def.access === 'admin' && identity.projects !== null) {
            throw forbidden('this route needs a token that is not limited to projects');
          }
          next();
        } catch (e) {
          next(e);
        }
      });
    }
    if (!def.rawBody && def.method !== 'get' && def.method !== 'delete') {
      // Whatever its Content-Type says (none, `text/plain`, the form type `curl -d` sends), a body
      // is read as JSON: what the client meant, or a 400 saying it is not JSON, never ignored.
      const json = def.yaml ? (req: { headers: { 'content-type'?: string } }) => !YAML_TYPES.includes(mediaType(req.headers['content-type'])) : () => true;
      handlers.push(utf8Only, express.json({ type: json, limit: def.bodyLimit ?? '1mb', strict: false, verify: verifyUtf8, reviver: wellFormed }));
      if (def.yaml) handlers.push(express.text({ type: YAML_TYPES, limit: def.bodyLimit ?? '1mb', verify: verifyUtf8 }), parseYamlBody);
    }
    handlers.push(async (req: Request, res: Response, next: NextFunction) => {
      try {
        // Set by the first handler on every route whose access is not `public`.
        const identity = ((def.access ?? 'token') !== 'public' ? res.locals.identity : undefined) as Identity;
        const params = validate(def.params, req.params, 'path');
        assertQueryEncoding(req.originalUrl);
        const query = validate(def.query, { ...(req.query as object) }, 'query');
        const rawBody = req.body === undefined && def.body ? {} : req.body;
        const body = def.rawBody ? undefined : validate(def.body, rawBody, 'body');
        const reply = await def.handler({ req, res, body, query, params, identity, api });
        if (res.headersSent || !reply) return;
        for (const [k, v] of Object.entries(reply.headers ?? {})) res.setHeader(k, v);
        const status = reply.status ?? 200;
        if (reply.body === undefined || status === 204) res.status(status).end();
        else res.status(status).json(reply.body);
      } catch (e) {
        next(e);
      }
    });
    router[def.method](expressPath(def.path), ...handlers);
  }
  return router;
}

/**
 * What no route answered: 405 with `Allow` when the path is a route's under another method
 * (RFC 9110 §15.5.6), 426 for a WebSocket route asked without a handshake, else 404. The code
 * stays `invalid_argument` for both (DESIGN.md §3 names none of its own for them, as for 415:
 * docs/decisions.md "Requests and errors").
 */
export function unknownRoute(routes: Pick<RouteDef, 'method' | 'path'>[], websocketPaths: string[]): express.RequestHandler {
  const known = routes.map((r) => ({ method: r.method.toUpperCase(), pattern: pathPattern(r.path) }));
  const sockets = websocketPaths.map(pathPattern);
  return (req, _res, next) => {
    if ((req.method === 'GET' || req.method === 'HEAD') && sockets.some((p) => p.test(req.path))) {
      return next(new StatusError(426, 'invalid_argument', `${req.path} is a WebSocket route: connect with a WebSocket handshake (Upgrade: websocket)`, [], { Upgrade: 'websocket', Connection: 'Upgrade' }));
    }
    const allowed = new Set(known.filter((r) => r.pattern.test(req.path)).map((r) => r.method));
    if (sockets.some((p) => p.test(req.path))) allowed.add('GET');
    if (allowed.size === 0) return next(notFound(`route ${req.method} ${req.path}`));
    if (allowed.has('GET')) allowed.add('HEAD');
    const allow = [...allowed].sort().join(', ');
    next(new StatusError(405, 'invalid_argument', `${req.method} is not a method of ${req.path}: it takes ${allow}`, [{ field: 'method', issue: `must be one of ${allow}` }], { Allow: allow }));
  };
}
