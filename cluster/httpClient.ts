import http from 'node:http';
import https from 'node:https';
import type Joi from 'joi';
import { BoxhostError, ErrorCode, unavailable } from '../core/errors';
import { HTTP_BUFFER_BYTES } from '../core/listen';
import type { Duplex, Readable } from 'node:stream';
import type { FileList, FileStat } from '../core/apiTypes';
import WebSocket from 'ws';
import type { VolumeInfoWire, BaseRefWire, StagedImport, BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, ExecSession, ExecSessionRequest, NodeClient, NodeServiceSpec, NodeServiceState, ServiceGate } from './types';
import { sessionOverWs } from './wsSession';
import {
  AGENT_ERROR_CODES, AGENT_RETRY_AFTER_S, agentPath, agentRoutes, errorBodySchema, execResultSchema, FILE_STAT_HEADER, fileListSchema, fileStatSchema, MAX_AGENT_ANSWER_BYTES, serviceListSchema,
  serviceStartAnswerSchema, serviceStateSchema, snapshotBlockersSchema, snapshotsSchema, volumeInfoSchema, stagedImportSchema, TUNNEL_PROTOCOL,
} from './protocol';

/** Time an agent may take beyond the exec's own timeout (runc start, output drain). */
const EXEC_MARGIN_MS = 30_000;
const CALL_TIMEOUT_MS = 30_000;
/** What a service call may wait for in the box: a stop's grace is at most an hour. */
const SERVICE_WAIT_MS = 3_600_000;
/** A file transfer that moves no byte for this long has stalled. */
const STREAM_IDLE_MS = 60_000;
/** An agent answers with its headers within a quarter second, even for an exec that runs for
 *  minutes (the result follows in the body; a short exec sends both at once): a node that does
 *  not within this long is hung. */
const ACK_TIMEOUT_MS = 5_000;

interface CallOptions {
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

  volumeInfo(volumeId: string): Promise<VolumeInfoWire> {
    if (!/^v[a-z0-9]{1,31}$/.test(volumeId)) throw new Error('invalid volume id');
    return this.call('GET', agentRoutes.volumeInfo.replace(':volumeId', volumeId), undefined, { totalMs: CALL_TIMEOUT_MS, schema: volumeInfoSchema });
  }

  async deleteSnapshot(boxId: string, name: string): Promise<void> {
    await this.call('DELETE', `${agentPath('snapshots', boxId)}?name=${encodeURIComponent(name)}`, undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  restoreBlockers(boxId: string, name: string): Promise<{ snapshots: string[]; forks: string[] }> {
    return this.call('GET', `${agentPath('snapshotBlockers', boxId)}?name=${encodeURIComponent(name)}`, undefined, { totalMs: CALL_TIMEOUT_MS, schema: snapshotBlockersSchema });
  }

  async stageBaseImport(data: Readable): Promise<StagedImport> {
    return this.uploadAnswer<StagedImport>(await this.stream('PUT', agentPath('baseImports'), data), stagedImportSchema, 'staged import');
  }

  async discardStagedImport(token: string): Promise<void> {
    await this.call('DELETE', `${agentPath('baseImports')}?token=${encodeURIComponent(token)}`, undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  async exportBase(base: BaseRefWire): Promise<Readable> {
    const res = await this.stream('GET', `${agentPath('bases')}?${baseQuery(base)}`);
    if (res.statusCode !== 200) throw await this.streamError(res);
    return res;
  }

  async destroyBase(base: BaseRefWire): Promise<void> {
    await this.call('DELETE', `${agentPath('bases')}?${baseQuery(base)}`, undefined, { totalMs: 5 * 60_000 });
  }

  /** An interactive session through the agent's WebSocket (cluster/protocol.ts `execWs`). */
  execSession(boxId: string, req: ExecSessionRequest): Promise<ExecSession> {
    const url = new URL(agentPath('execWs', boxId), this.base);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${this.secret}` }, handshakeTimeout: ACK_TIMEOUT_MS });
    return new Promise((resolve, reject) => {
      let answered = false;
      const fail = (e: BoxhostError) => {
        if (answered) return;
        answered = true;
        clearTimeout(timer);
        ws.terminate();
        reject(e);
      };
      // The agent starts the process before it answers: a start that takes longer is a hung node.
      const timer = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not start the session within ${CALL_TIMEOUT_MS / 1000} s`)), CALL_TIMEOUT_MS);
      ws.on('error', (e) => fail(this.unreachable(e)));
      ws.on('unexpected-response', (_req, res) => fail(unavailable(`node ${this.nodeId} refused the session (${res.statusCode})`)));
      ws.on('close', () => fail(unavailable(`node ${this.nodeId} closed the session before it started`)));
      ws.once('open', () => ws.send(JSON.stringify(req)));
      ws.once('message', (data: Buffer, isBinary?: boolean) => {
        let o: unknown;
        try {
          o = isBinary ? undefined : JSON.parse(data.toString('utf8'));
        } catch {
          o = undefined;
        }
        if (o && typeof o === 'object' && (o as { ok?: unknown }).ok === true) {
          answered = true;
          clearTimeout(timer);
          ws.removeAllListeners('close');
          ws.removeAllListeners('error');
          resolve(sessionOverWs(ws));
        } else fail(this.agentError(500, o));
      });
    });
  }

  /** A raw connection to a box's port through the agent (an HTTP upgrade to `boxhost-tunnel`). */
  tunnel(boxId: string, address: string, port: number): Promise<Duplex> {
    const url = new URL(`${agentPath('tunnel', boxId)}?${new URLSearchParams({ address, port: String(port) })}`, this.base);
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(url, { headers: { authorization: `Bearer ${this.secret}`, connection: 'Upgrade', upgrade: TUNNEL_PROTOCOL } });
      const timer = setTimeout(() => fail(unavailable(`node ${this.nodeId} did not open a tunnel within ${(ACK_TIMEOUT_MS * 2) / 1000} s`)), ACK_TIMEOUT_MS * 2);
      const fail = (e: BoxhostError) => {
        clearTimeout(timer);
        req.destroy();
        reject(e);
      };
      req.on('upgrade', (_res, sock, head) => {
        clearTimeout(timer);
        if (head.length) sock.unshift(head);
        resolve(sock);
      });
      req.on('response', (res) => {
        void this.streamError(res).then((e) => fail(Object.assign(e, { refused: res.statusCode === 502 })));
      });
      req.on('error', (e) => fail(this.unreachable(e)));
      req.end();
    });
  }

  // ------------------------------------------------------------------------------ services

  /** A service call: as long as a stop's grace (at most an hour) or a gate's time may take. */
  private service<T>(boxId: string, body: object, schema?: Joi.Schema, waitMs = SERVICE_WAIT_MS): Promise<T> {
    return this.call<T>('POST', agentPath('services', boxId), body, { totalMs: waitMs + CALL_TIMEOUT_MS, schema });
  }

  serviceStart(boxId: string, spec: NodeServiceSpec, gate?: ServiceGate): Promise<{ service: NodeServiceState; replaced: boolean }> {
    return this.service(boxId, { op: 'start', spec, gate }, serviceStartAnswerSchema, SERVICE_WAIT_MS + (gate?.timeoutMs ?? 0));
  }

  async serviceList(boxId: string): Promise<NodeServiceState[]> {
    return (await this.service<{ services: NodeServiceState[] }>(boxId, { op: 'list' }, serviceListSchema, 0)).services;
  }

  serviceGet(boxId: string, name: string): Promise<NodeServiceState> {
    return this.service(boxId, { op: 'get', name }, serviceStateSchema, 0);
  }

  serviceControl(boxId: string, name: string, action: 'start' | 'stop' | 'restart', opts: { signal?: string; graceMs?: number } = {}): Promise<NodeServiceState> {
    return this.service(boxId, { op: 'control', name, action, ...opts }, serviceStateSchema);
  }

  async serviceDelete(boxId: string, name: string): Promise<void> {
    await this.service(boxId, { op: 'delete', name });
  }

  async serviceLogs(boxId: string, name: string, opts: { tail?: number; follow?: boolean }): Promise<Readable> {
    const q = new URLSearchParams({ name, ...(opts.tail === undefined ? {} : { tail: String(opts.tail) }), ...(opts.follow ? { follow: 'true' } : {}) });
    const res = await this.stream('GET', `${agentPath('serviceLogs', boxId)}?${q}`, undefined, opts.follow ? 0 : STREAM_IDLE_MS);
    if (res.statusCode !== 200) throw await this.streamError(res);
    return res;
  }

  // ---------------------------------------------------------------- files (streamed)

  private filePath(route: 'files' | 'fileStat' | 'fileList', boxId: string, p: string, extra = ''): string {
    return `${agentPath(route, boxId)}?path=${encodeURIComponent(p)}${extra}`;
  }

  async fileStat(boxId: string, p: string): Promise<FileStat> {
    return this.call<FileStat>('GET', this.filePath('fileStat', boxId, p), undefined, { totalMs: CALL_TIMEOUT_MS, schema: fileStatSchema });
  }

  async fileList(boxId: string, p: string): Promise<FileList> {
    return this.call<FileList>('GET', this.filePath('fileList', boxId, p), undefined, { totalMs: CALL_TIMEOUT_MS, schema: fileListSchema });
  }

  async fileDelete(boxId: string, p: string, recursive: boolean): Promise<void> {
    await this.call('DELETE', this.filePath('files', boxId, p, recursive ? '&recursive=true' : ''), undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  async fileRead(boxId: string, p: string): Promise<{ stat: FileStat; data: Readable }> {
    const res = await this.stream('GET', this.filePath('files', boxId, p));
    if (res.statusCode !== 200) throw await this.streamError(res);
    const { value, error } = fileStatSchema.validate(decodeStat(res.headers[FILE_STAT_HEADER]), { stripUnknown: true });
    if (error) {
      res.destroy();
      throw unavailable(`node ${this.nodeId} answered a file without a valid stat: ${error.message}`);
    }
    return { stat: value as FileStat, data: res };
  }

  async fileWrite(boxId: string, p: string, data: Readable, mode?: number): Promise<FileStat> {
    const res = await this.stream('PUT', this.filePath('files', boxId, p, mode === undefined ? '' : `&mode=${mode.toString(8).padStart(4, '0')}`), data);
    return this.uploadAnswer<FileStat>(res, fileStatSchema, 'stat');
  }

  /** The JSON answer to a streamed upload: 200 and `schema`, or the agent's error. */
  private async uploadAnswer<T>(res: http.IncomingMessage, schema: Joi.Schema, what: string): Promise<T> {
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
  private stream(method: string, path: string, body?: Readable, idleMs = STREAM_IDLE_MS): Promise<http.IncomingMessage> {
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
        headers: { authorization: `Bearer ${this.secret}`, ...(body ? { 'content-type': 'application/octet-stream' } : {}) },
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

  private async streamError(res: http.IncomingMessage): Promise<BoxhostError> {
    try {
      return this.agentError(res.statusCode ?? 0, JSON.parse((await readBounded(res, 64 * 1024)).toString('utf8')));
    } catch {
      return unavailable(`node ${this.nodeId} answered ${res.statusCode}`);
    }
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
      /** Bumped when the socket connects and when the headers arrive (what `ack` waits for). */
      let progress = 0;
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
  private agentError(status: number, body: unknown): BoxhostError {
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

  private unreachable(e: Error): BoxhostError {
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

const baseQuery = (b: BaseRefWire) => `name=${encodeURIComponent(b.name)}&version=${encodeURIComponent(b.version)}`;

function decodeStat(header: string | string[] | undefined): unknown {
  if (typeof header !== 'string' || header.length > 64 * 1024) return undefined;
  try {
    return JSON.parse(Buffer.from(header, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
}
