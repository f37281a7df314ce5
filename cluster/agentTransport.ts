import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import type Joi from 'joi';
import { BoxhostError, ErrorCode, unavailable } from '../core/errors';
import { HTTP_BUFFER_BYTES } from '../core/listen';
import { AGENT_ERROR_CODES, AGENT_RETRY_AFTER_S, errorBodySchema, MAX_AGENT_ANSWER_BYTES } from './protocol';

/** A file transfer that moves no byte for this long has stalled. */
export const STREAM_IDLE_MS = 60_000;
/** An agent answers with its headers within a quarter second, even for an exec that runs for
 *  minutes (the result follows in the body; a short exec sends both at once): a node that does
 *  not within this long is hung. */
export const ACK_TIMEOUT_MS = 5_000;

export interface CallOptions {
  /** The whole call, body included. */
  totalMs: number;
  schema?: Joi.Schema;
  /** The answer is a 200 whose body is `{result}` or `{error}` (exec: the headers may go out before the outcome). */
  envelope?: boolean;
  /** Aborting it drops the call: the agent sees its request close and ends what it ran. */
  signal?: AbortSignal;
}

// No socket limit: a call waiting for a free socket would look like a hung node. The sockets
// buffer as the api's HTTP servers do: with Node's 16 KiB default an upload piped to a node
// paused its body once per 64 KiB piece (docs/decisions.md "Files at stream speed"). The agent
// hands the option to each socket it makes (net.Socket → stream.Duplex).
const socketOptions = { keepAlive: true, highWaterMark: HTTP_BUFFER_BYTES } as http.AgentOptions;
const agents = { http: new http.Agent(socketOptions), https: new https.Agent(socketOptions) };

/**
 * One node agent's HTTP endpoint, as the api's NodeClient calls it: JSON calls whose answers
 * are size-capped and schema-checked, streamed calls for files and logs, and every failure
 * the contract's error (the agent's own error body passed on with its codes whitelisted; a node
 * that cannot be reached or stays silent `unavailable`, 503, with why).
 */
export class AgentTransport {
  constructor(
    readonly nodeId: string,
    readonly base: URL,
    private readonly secret: string,
  ) {}

  /** The header every call to the agent carries (the cluster secret). */
  get authorization(): string {
    return `Bearer ${this.secret}`;
  }

  /** The JSON answer to a streamed upload: 200 and `schema`, or the agent's error. */
  async uploadAnswer<T>(res: http.IncomingMessage, schema: Joi.Schema, what: string): Promise<T> {
    const body = await readBounded(res, 64 * 1024).catch((e: Error) => {
      throw this.unreachable(e);
    });
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      throw unavailable(`node ${this.nodeId} answered ${res.statusCode} without a JSON body`);
    }
    if (res.statusCode !== 200) throw this.agentError(res.statusCode ?? 0, parsed);
    const { value, error } = schema.validate(parsed, { stripUnknown: true });
    if (error) throw unavailable(`node ${this.nodeId} answered a malformed ${what}: ${error.message}`);
    return value as T;
  }

  /**
   * A streamed call: resolves with the response once its headers are in (any status), the
   * request body piped from `body`. The node must accept the connection and, without a body,
   * answer within ACK_TIMEOUT_MS; a transfer that then stalls for STREAM_IDLE_MS fails.
   */
  stream(method: string, path: string, body?: Readable, idleMs = STREAM_IDLE_MS): Promise<http.IncomingMessage> {
    const url = new URL(path, this.base);
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      let settled = false;
      const fail = (e: BoxhostError) => {
        clearTimeout(ack);
        if (!settled) reject(e);
        settled = true;
        req.destroy();
        // The body is the api's own client's upload: read and dropped, not destroyed, so that
        // client gets its error answer rather than a reset.
        if (body) {
          body.unpipe(req);
          body.resume();
        }
      };
      let ack: NodeJS.Timeout | undefined = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not answer within ${ACK_TIMEOUT_MS / 1000} s`)), ACK_TIMEOUT_MS);
      const req = mod.request(url, {
        method,
        agent: url.protocol === 'https:' ? agents.https : agents.http,
        headers: { authorization: this.authorization, ...(body ? { 'content-type': 'application/octet-stream' } : {}) },
      }, (res) => {
        clearTimeout(ack);
        settled = true;
        res.on('error', () => undefined);
        resolve(res);
      });
      // A followed log may be silent for as long as its service is: no idle limit then.
      if (idleMs > 0) req.setTimeout(idleMs, () => fail(unavailable(`node ${this.nodeId} stalled for ${idleMs / 1000} s`)));
      req.on('error', (e) => fail(this.unreachable(e)));
      if (body) {
        // The body streams as long as it takes: only its end starts the wait for an answer.
        clearTimeout(ack);
        ack = undefined;
        body.on('error', () => fail(unavailable('the upload failed before its end')));
        body.on('end', () => {
          if (!settled) ack = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not answer within ${ACK_TIMEOUT_MS / 1000} s of the upload's end`)), 60_000);
        });
        body.pipe(req);
      } else req.end();
    });
  }

  async streamError(res: http.IncomingMessage): Promise<BoxhostError> {
    try {
      return this.agentError(res.statusCode ?? 0, JSON.parse((await readBounded(res, 64 * 1024)).toString('utf8')));
    } catch {
      return unavailable(`node ${this.nodeId} answered ${res.statusCode}`);
    }
  }

  call<T>(method: string, path: string, body: unknown, opts: CallOptions): Promise<T> {
    const { schema } = opts;
    const url = new URL(path, this.base);
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise<T>((resolve, reject) => {
      const { signal } = opts;
      const fail = (e: BoxhostError) => {
        clearTimeout(ack);
        clearTimeout(total);
        signal?.removeEventListener('abort', onAbort);
        req.destroy();
        reject(e);
      };
      // The caller went away: the request is destroyed, so the agent's side closes too.
      const onAbort = () => fail(unavailable(`the call to node ${this.nodeId} was cancelled: its caller went away`));
      // Only an exec answers its headers before its outcome; for the other calls the
      // headers come with the answer, and only the whole call's time counts (see 'socket').
      let ack: NodeJS.Timeout | undefined;
      /** Bumped when the socket connects and when the headers arrive (what `ack` waits for). */
      let progress = 0;
      const total = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not finish the call within ${Math.round(opts.totalMs / 1000)} s`)), opts.totalMs);
      const req = mod.request(
        url,
        {
          method,
          agent: url.protocol === 'https:' ? agents.https : agents.http,
          headers: {
            authorization: this.authorization,
            ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}),
          },
        },
        (res) => {
          progress++;
          clearTimeout(ack);
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (b: Buffer) => {
            size += b.length;
            if (size > MAX_AGENT_ANSWER_BYTES) return fail(unavailable(`node ${this.nodeId} answered more than ${MAX_AGENT_ANSWER_BYTES} bytes`));
            chunks.push(b);
          });
          res.on('error', (e) => fail(this.unreachable(e)));
          res.on('end', () => {
            clearTimeout(total);
            signal?.removeEventListener('abort', onAbort);
            if (size > MAX_AGENT_ANSWER_BYTES) return;
            let status = res.statusCode ?? 0;
            // Only a call that expects no body may get none.
            if (status === 204 && !schema) return resolve(undefined as T);
            let parsed: unknown;
            try {
              parsed = status === 204 ? undefined : JSON.parse(Buffer.concat(chunks).toString('utf8'));
            } catch {
              return reject(unavailable(`node ${this.nodeId} answered ${status} without a JSON body`));
            }
            if (opts.envelope && status === 200) {
              // `{result}` or `{error}`: the status went out before the outcome was known.
              const env = parsed as { result?: unknown; error?: unknown } | null;
              if (env && typeof env === 'object' && 'error' in env) status = 500;
              else parsed = env?.result;
            }
            if (status >= 200 && status < 300) {
              if (!schema) return resolve(parsed as T);
              const { value, error } = schema.required().validate(parsed, { stripUnknown: true });
              return error ? reject(unavailable(`node ${this.nodeId} answered a malformed body: ${error.message}`)) : resolve(value as T);
            }
            reject(this.agentError(status, parsed));
          });
        },
      );
      req.on('error', (e) => fail(this.unreachable(e)));
      // A node that cannot be connected to within ACK_TIMEOUT_MS is gone (a machine that
      // vanished drops packets; the kernel would wait minutes). Once connected, an exec's node
      // must send its headers within the same time, or it is hung.
      req.on('socket', (sock) => {
        // A loop that was busy (this process serving the node too, a large answer being encoded)
        // may hold the very event the timer waited for: it is looked for once more after the
        // poll phase (setImmediate runs after pending I/O) before the node is called silent.
        const silent = (what: string) => () => {
          const seen = progress;
          setImmediate(() => progress === seen && fail(unavailable(`node ${this.nodeId} did not ${what} within ${ACK_TIMEOUT_MS / 1000} s`)));
        };
        const afterConnect = () => {
          progress++;
          clearTimeout(ack);
          ack = opts.envelope ? setTimeout(silent('answer'), ACK_TIMEOUT_MS) : undefined;
        };
        if (sock.connecting) {
          ack = setTimeout(silent('accept a connection'), ACK_TIMEOUT_MS);
          sock.once('connect', afterConnect);
        } else afterConnect();
      });
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      req.end(payload);
    });
  }

  /** The agent's own error body, re-raised as the same contract error (codes whitelisted). */
  agentError(status: number, body: unknown): BoxhostError {
    const { value, error } = errorBodySchema.validate(body, { stripUnknown: true });
    if (error) return unavailable(`node ${this.nodeId} answered ${status}`);
    const e = value.error as { code: string; message: string; details?: { field: string; issue: string }[] };
    if (e.code === 'unauthenticated') return unavailable(`node ${this.nodeId} refused the cluster secret`);
    const code = (AGENT_ERROR_CODES as string[]).includes(e.code) ? (e.code as ErrorCode) : 'internal';
    // A node over its exec cap: the client is told when to come back, as for the api's own caps.
    // So is one told its box or its agent is unavailable for a moment (docs/boxd.md).
    const headers: Record<string, string> = code === 'rate_limited' || code === 'unavailable' ? { 'Retry-After': String(AGENT_RETRY_AFTER_S) } : {};
    return new BoxhostError(code, e.message, e.details ?? [], headers);
  }

  unreachable(e: Error): BoxhostError {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ECONNREFUSED' ? 'connection refused' : code === 'ECONNRESET' ? 'connection reset' : e.message;
    return unavailable(`node ${this.nodeId} is not answering: ${why}`);
  }
}

/** A stream's bytes up to `max` (more is an error). */
function readBounded(res: Readable, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (b: Buffer) => {
      size += b.length;
      if (size > max) {
        res.destroy();
        return reject(new Error(`answer larger than ${max} bytes`));
      }
      chunks.push(b);
    });
    res.on('end', () => resolve(Buffer.concat(chunks)));
    res.on('error', reject);
  });
}
