import http from 'node:http';
import https from 'node:https';
import type Joi from 'joi';
import { BoxhostError, ErrorCode, unavailable } from '../core/errors';
import type { BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, NodeClient } from './types';
import {
  AGENT_ERROR_CODES, AGENT_RETRY_AFTER_S, agentPath, errorBodySchema, execResultSchema, MAX_AGENT_ANSWER_BYTES, snapshotsSchema,
} from './protocol';

/** Time an agent may take beyond the exec's own timeout (runc start, output drain). */
const EXEC_MARGIN_MS = 30_000;
const CALL_TIMEOUT_MS = 30_000;
/** An agent answers with its headers at once, even for an exec that runs for minutes (the
 *  result follows in the body): a node that does not within this long is hung. */
const ACK_TIMEOUT_MS = 5_000;

interface CallOptions {
  /** The whole call, body included. */
  totalMs: number;
  schema?: Joi.Schema;
  /** The answer is a 200 whose body is `{result}` or `{error}` (exec: headers go out first). */
  envelope?: boolean;
  /** Aborting it drops the call: the agent sees its request close and ends what it ran. */
  signal?: AbortSignal;
}

// No socket limit: a call waiting for a free socket would look like a hung node.
const agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true }) };

/**
 * A node reached through its agent's HTTP endpoint. Connections are kept alive (an exec costs
 * one round trip), answers are size-capped and schema-checked, and a node that cannot be
 * reached is `unavailable` (503) with why.
 */
export class HttpNodeClient implements NodeClient {
  private readonly base: URL;
  readonly agentUrl: string;

  constructor(
    readonly nodeId: string,
    agentUrl: string,
    private readonly secret: string,
  ) {
    this.agentUrl = agentUrl;
    this.base = new URL(agentUrl);
  }

  async exec(boxId: string, req: ExecRequest): Promise<ExecResult> {
    // The signal is not sent: closing the request is how the agent hears of it.
    const { signal, stdin, ...rest } = req;
    const body = { ...rest, stdin: stdin?.toString('base64') };
    const totalMs = (req.detach ? 0 : (req.timeoutMs ?? 0)) + EXEC_MARGIN_MS;
    return this.call<ExecResult>('POST', agentPath('exec', boxId), body, { totalMs, schema: execResultSchema, envelope: true, signal });
  }

  async updateLimits(boxId: string, limits: BoxLimits): Promise<void> {
    await this.call('POST', agentPath('limits', boxId), limits, { totalMs: CALL_TIMEOUT_MS });
  }

  async listSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    return (await this.call<{ snapshots: BoxSnapshotInfo[] }>('GET', agentPath('snapshots', boxId), undefined, { totalMs: CALL_TIMEOUT_MS, schema: snapshotsSchema })).snapshots;
  }

  private call<T>(method: string, path: string, body: unknown, opts: CallOptions): Promise<T> {
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
      const total = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not finish the call within ${Math.round(opts.totalMs / 1000)} s`)), opts.totalMs);
      const req = mod.request(
        url,
        {
          method,
          agent: url.protocol === 'https:' ? agents.https : agents.http,
          headers: {
            authorization: `Bearer ${this.secret}`,
            ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}),
          },
        },
        (res) => {
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
        const silent = (what: string) => () => fail(unavailable(`node ${this.nodeId} did not ${what} within ${ACK_TIMEOUT_MS / 1000} s`));
        const afterConnect = () => {
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
  private agentError(status: number, body: unknown): BoxhostError {
    const { value, error } = errorBodySchema.validate(body, { stripUnknown: true });
    if (error) return unavailable(`node ${this.nodeId} answered ${status}`);
    const e = value.error as { code: string; message: string; details?: { field: string; issue: string }[] };
    if (e.code === 'unauthenticated') return unavailable(`node ${this.nodeId} refused the cluster secret`);
    const code = (AGENT_ERROR_CODES as string[]).includes(e.code) ? (e.code as ErrorCode) : 'internal';
    // A node over its exec cap: the client is told when to come back, as for the api's own caps.
    const headers: Record<string, string> = code === 'rate_limited' ? { 'Retry-After': String(AGENT_RETRY_AFTER_S) } : {};
    return new BoxhostError(code, e.message, e.details ?? [], headers);
  }

  private unreachable(e: Error): BoxhostError {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ECONNREFUSED' ? 'connection refused' : code === 'ECONNRESET' ? 'connection reset' : e.message;
    return unavailable(`node ${this.nodeId} is not answering: ${why}`);
  }
}
