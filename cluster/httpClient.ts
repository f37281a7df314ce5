import http from 'node:http';
import https from 'node:https';
import type Joi from 'joi';
import { BoxhostError, unavailable } from '../core/errors';
import type { Duplex, Readable } from 'node:stream';
import type { FileList, FileStat } from '../core/apiTypes';
import WebSocket from 'ws';
import type { VolumeInfoWire, BaseRefWire, StagedImport, BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, ExecSession, ExecSessionRequest, NodeClient, NodeServiceSpec, NodeServiceState, ServiceGate } from './types';
import { sessionOverWs } from './wsSession';
import { ACK_TIMEOUT_MS, AgentTransport, STREAM_IDLE_MS } from './agentTransport';
import {
  agentPath, agentRoutes, execResultSchema, FILE_STAT_HEADER, fileListSchema, fileStatSchema, serviceListSchema,
  serviceStartAnswerSchema, serviceStateSchema, snapshotBlockersSchema, snapshotsSchema, volumeInfoSchema, stagedImportSchema, TUNNEL_PROTOCOL,
} from './protocol';

/** Time an agent may take beyond the exec's own timeout (runc start, output drain). */
const EXEC_MARGIN_MS = 30_000;
const CALL_TIMEOUT_MS = 30_000;
/** What a service call may wait for in the box: a stop's grace is at most an hour. */
const SERVICE_WAIT_MS = 3_600_000;

/**
 * A node reached through its agent's HTTP endpoint. Connections are kept alive (an exec costs
 * one round trip), answers are size-capped and schema-checked, and a node that cannot be
 * reached is `unavailable` (503) with why.
 */
export class HttpNodeClient implements NodeClient {
  readonly agentUrl: string;
  /** The agent's HTTP calls and streams (agentTransport.ts). */
  private readonly t: AgentTransport;

  constructor(
    readonly nodeId: string,
    agentUrl: string,
    secret: string,
  ) {
    this.agentUrl = agentUrl;
    this.t = new AgentTransport(nodeId, new URL(agentUrl), secret);
  }

  async exec(boxId: string, req: ExecRequest): Promise<ExecResult> {
    // The signal is not sent: closing the request is how the agent hears of it.
    const { signal, stdin, ...rest } = req;
    const body = { ...rest, stdin: stdin?.toString('base64') };
    const totalMs = (req.detach ? 0 : (req.timeoutMs ?? 0)) + EXEC_MARGIN_MS;
    return this.t.call<ExecResult>('POST', agentPath('exec', boxId), body, { totalMs, schema: execResultSchema, envelope: true, signal });
  }

  async updateLimits(boxId: string, limits: BoxLimits): Promise<void> {
    await this.t.call('POST', agentPath('limits', boxId), limits, { totalMs: CALL_TIMEOUT_MS });
  }

  async listSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    return (await this.t.call<{ snapshots: BoxSnapshotInfo[] }>('GET', agentPath('snapshots', boxId), undefined, { totalMs: CALL_TIMEOUT_MS, schema: snapshotsSchema })).snapshots;
  }

  volumeInfo(volumeId: string): Promise<VolumeInfoWire> {
    if (!/^v[a-z0-9]{1,31}$/.test(volumeId)) throw new Error('invalid volume id');
    return this.t.call('GET', agentRoutes.volumeInfo.replace(':volumeId', volumeId), undefined, { totalMs: CALL_TIMEOUT_MS, schema: volumeInfoSchema });
  }

  async deleteSnapshot(boxId: string, name: string): Promise<void> {
    await this.t.call('DELETE', `${agentPath('snapshots', boxId)}?name=${encodeURIComponent(name)}`, undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  restoreBlockers(boxId: string, name: string): Promise<{ snapshots: string[]; forks: string[] }> {
    return this.t.call('GET', `${agentPath('snapshotBlockers', boxId)}?name=${encodeURIComponent(name)}`, undefined, { totalMs: CALL_TIMEOUT_MS, schema: snapshotBlockersSchema });
  }

  async stageBaseImport(data: Readable): Promise<StagedImport> {
    return this.t.uploadAnswer<StagedImport>(await this.t.stream('PUT', agentPath('baseImports'), data), stagedImportSchema, 'staged import');
  }

  async discardStagedImport(token: string): Promise<void> {
    await this.t.call('DELETE', `${agentPath('baseImports')}?token=${encodeURIComponent(token)}`, undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  async exportBase(base: BaseRefWire): Promise<Readable> {
    const res = await this.t.stream('GET', `${agentPath('bases')}?${baseQuery(base)}`);
    if (res.statusCode !== 200) throw await this.t.streamError(res);
    return res;
  }

  async destroyBase(base: BaseRefWire): Promise<void> {
    await this.t.call('DELETE', `${agentPath('bases')}?${baseQuery(base)}`, undefined, { totalMs: 5 * 60_000 });
  }

  /** An interactive session through the agent's WebSocket (cluster/protocol.ts `execWs`). */
  execSession(boxId: string, req: ExecSessionRequest): Promise<ExecSession> {
    const url = new URL(agentPath('execWs', boxId), this.t.base);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(url, { headers: { authorization: this.t.authorization }, handshakeTimeout: ACK_TIMEOUT_MS });
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
      ws.on('error', (e) => fail(this.t.unreachable(e)));
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
        } else fail(this.t.agentError(500, o));
      });
    });
  }

  /** A raw connection to a box's port through the agent (an HTTP upgrade to `boxhost-tunnel`). */
  tunnel(boxId: string, address: string, port: number): Promise<Duplex> {
    const url = new URL(`${agentPath('tunnel', boxId)}?${new URLSearchParams({ address, port: String(port) })}`, this.t.base);
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(url, { headers: { authorization: this.t.authorization, connection: 'Upgrade', upgrade: TUNNEL_PROTOCOL } });
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
        void this.t.streamError(res).then((e) => fail(Object.assign(e, { refused: res.statusCode === 502 })));
      });
      req.on('error', (e) => fail(this.t.unreachable(e)));
      req.end();
    });
  }

  // ------------------------------------------------------------------------------ services

  /** A service call: as long as a stop's grace (at most an hour) or a gate's time may take. */
  private service<T>(boxId: string, body: object, schema?: Joi.Schema, waitMs = SERVICE_WAIT_MS): Promise<T> {
    return this.t.call<T>('POST', agentPath('services', boxId), body, { totalMs: waitMs + CALL_TIMEOUT_MS, schema });
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
    const res = await this.t.stream('GET', `${agentPath('serviceLogs', boxId)}?${q}`, undefined, opts.follow ? 0 : STREAM_IDLE_MS);
    if (res.statusCode !== 200) throw await this.t.streamError(res);
    return res;
  }

  // ---------------------------------------------------------------- files (streamed)

  private filePath(route: 'files' | 'fileStat' | 'fileList', boxId: string, p: string, extra = ''): string {
    return `${agentPath(route, boxId)}?path=${encodeURIComponent(p)}${extra}`;
  }

  async fileStat(boxId: string, p: string): Promise<FileStat> {
    return this.t.call<FileStat>('GET', this.filePath('fileStat', boxId, p), undefined, { totalMs: CALL_TIMEOUT_MS, schema: fileStatSchema });
  }

  async fileList(boxId: string, p: string): Promise<FileList> {
    return this.t.call<FileList>('GET', this.filePath('fileList', boxId, p), undefined, { totalMs: CALL_TIMEOUT_MS, schema: fileListSchema });
  }

  async fileDelete(boxId: string, p: string, recursive: boolean): Promise<void> {
    await this.t.call('DELETE', this.filePath('files', boxId, p, recursive ? '&recursive=true' : ''), undefined, { totalMs: CALL_TIMEOUT_MS });
  }

  async fileRead(boxId: string, p: string): Promise<{ stat: FileStat; data: Readable }> {
    const res = await this.t.stream('GET', this.filePath('files', boxId, p));
    if (res.statusCode !== 200) throw await this.t.streamError(res);
    const { value, error } = fileStatSchema.validate(decodeStat(res.headers[FILE_STAT_HEADER]), { stripUnknown: true });
    if (error) {
      res.destroy();
      throw unavailable(`node ${this.nodeId} answered a file without a valid stat: ${error.message}`);
    }
    return { stat: value as FileStat, data: res };
  }

  async fileWrite(boxId: string, p: string, data: Readable, mode?: number): Promise<FileStat> {
    const res = await this.t.stream('PUT', this.filePath('files', boxId, p, mode === undefined ? '' : `&mode=${mode.toString(8).padStart(4, '0')}`), data);
    return this.t.uploadAnswer<FileStat>(res, fileStatSchema, 'stat');
  }

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
