/**
 * The calls the api makes into a node that cannot wait in a queue (DESIGN.md §1): one
 * interface, two transports. In-process when the node lives in the api's own process (no
 * network hop), HTTP to the node agent otherwise (`cluster/httpClient.ts`). Every error is a
 * `BoxhostError` of the contract: `invalid_argument` for a request the box cannot do,
 * `conflict` for a box that is not running, `unavailable` for a node that does not answer.
 */

import type { Duplex, Readable, Writable } from 'node:stream';
import type { FileList, FileStat } from '../core/apiTypes';

/** Each of stdout and stderr of a collected exec is kept up to this many bytes. */
export const EXEC_OUTPUT_CAP_BYTES = 16 * 1024 * 1024;

export interface ExecRequest {
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  tty?: boolean;
  /** Start and return at once (the process keeps running). */
  detach?: boolean;
  /** Kill the process after this long; exit code 124 then. */
  timeoutMs?: number;
  /** Bytes sent on stdin (non-detached only). */
  stdin?: Buffer;
  /** Aborting it ends the process (its caller went away); the result then says exit 137. Not
   *  sent on the wire: the agent aborts when the api's request is closed. */
  signal?: AbortSignal;
}

export interface ExecSessionRequest {
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  tty?: boolean;
  cols?: number;
  rows?: number;
  /** The process outlives the session: closing it lets go of the process instead of ending it. */
  noHup?: boolean;
  /** Kill the process (and its group) after this long: its exit code is 124, `timedOut` true. */
  timeoutMs?: number;
}

/** How a session's process ended. */
export interface SessionExit {
  exitCode: number;
  timedOut?: boolean;
}

/** A process whose streams flow both ways while it runs. */
export interface ExecSession {
  stdin: Writable;
  stdout: Readable;
  /** Empty with a tty: everything comes on stdout. */
  stderr: Readable;
  resize(cols: number, rows: number): void;
  signal(sig: NodeJS.Signals): void;
  /** Ends the process (and its group) if it still runs. */
  close(): void;
  /** The peer hung up: a `noHup` session lets go of its process (it runs on); any other ends it
   *  as close() does. */
  release(): void;
  /** Its exit code once it ended and its output is drained (`timedOut` when the session's
   *  timeout killed it); rejects when the session failed. */
  exited: Promise<SessionExit>;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  /** Host-side pid of the started process. */
  pid: number;
  detached: boolean;
  /** True when stdout or stderr passed the output cap and was cut. */
  truncated: boolean;
}

export interface BoxSnapshotInfo {
  name: string;
  createdAt: string;
  sizeBytes: number;
  description?: string;
}

export interface VolumeInfoWire {
  usedBytes: number;
  snapshots: BoxSnapshotInfo[];
}

export interface BoxLimits {
  cpus?: number;
  ramMb?: number;
}

/** A supervised service as its box's agent reports it (docs/boxd.md "Services"). */
export interface NodeServiceState {
  name: string;
  state: 'starting' | 'running' | 'restarting' | 'stopped' | 'exited' | 'failed' | 'corrupt';
  /** The main process's pid in the box (0: none running). */
  pid: number;
  restarts: number;
  lastExitCode: number | null;
  /** Set on a corrupt spec's tombstone: why it did not load. */
  error?: string;
  /** The spec file as it is in the box: the box's word, checked again before use. */
  spec?: Record<string, unknown>;
}

/** A spec to start: boxd's fields (name, command, cwd, env, user, restart, stop) and the api's
 *  own (port, publish, ready, secret_env, tags), kept with it in the box. */
export type NodeServiceSpec = { name: string; command: string[] } & Record<string, unknown>;

/** A ready gate (DESIGN.md §6 "Services"): `path` makes it an HTTP gate (`status` wanted,
 *  absent: any 2xx), else TCP; looked at inside the box until it passes or `timeoutMs` ends. */
export interface ServiceGate {
  port: number;
  path?: string;
  status?: number;
  timeoutMs: number;
}

/** An upload a node has written to its disk and checked (docs/bases.md "Import rules"). */
export interface StagedImport {
  /** What its import job names it by (32 hex). */
  token: string;
  /** Bytes and sha256 (hex) of the upload as sent (compressed or not). */
  bytes: number;
  sha256: string;
  entries: number;
  unpackedBytes: number;
  /** Device nodes and FIFOs left out; files whose setuid/setgid bits were cleared. */
  dropped: number;
  setidCleared: number;
}

export interface BaseRefWire {
  name: string;
  version: string;
}

export interface NodeClient {
  readonly nodeId: string;
  /** File operations in a running box, every path resolved inside it (docs/files.md). */
  fileStat(boxId: string, path: string): Promise<FileStat>;
  fileList(boxId: string, path: string): Promise<FileList>;
  /** The file's stat, then its bytes streamed; destroying `data` ends the read. */
  fileRead(boxId: string, path: string): Promise<{ stat: FileStat; data: Readable }>;
  /** Writes the whole file from `data` (parents made); what the path is then. */
  fileWrite(boxId: string, path: string, data: Readable, mode?: number): Promise<FileStat>;
  fileDelete(boxId: string, path: string, recursive: boolean): Promise<void>;
  /** Starts an interactive process (WebSocket exec and console): resolves once it runs, so a
   *  refusal (bad cwd, unknown user, box stopped, node cap) is an error before any upgrade. */
  execSession(boxId: string, req: ExecSessionRequest): Promise<ExecSession>;
  /** Starts (or replaces) a service; with `gate`, answers once it passes. A gate that fails
   *  stops the service, lists it `failed`, and is 409 `not_ready` with its last output lines. */
  serviceStart(boxId: string, spec: NodeServiceSpec, gate?: ServiceGate): Promise<{ service: NodeServiceState; replaced: boolean }>;
  serviceList(boxId: string): Promise<NodeServiceState[]>;
  serviceGet(boxId: string, name: string): Promise<NodeServiceState>;
  /** start (the stored spec, enabled again), stop (its signal and grace unless given), restart. */
  serviceControl(boxId: string, name: string, action: 'start' | 'stop' | 'restart', opts?: { signal?: string; graceMs?: number }): Promise<NodeServiceState>;
  serviceDelete(boxId: string, name: string): Promise<void>;
  /** Its last `tail` lines, then with `follow` what it writes next until `data` is destroyed. */
  serviceLogs(boxId: string, name: string, opts: { tail?: number; follow?: boolean }): Promise<Readable>;
  /** A TCP connection to `port` of a running box at `address` (its address on this node's
   *  bridge), opened by the node: how the publish proxy reaches a box on another machine.
   *  Resolves once connected; nothing listening → 502-worthy `unavailable` with `refused`. */
  tunnel(boxId: string, address: string, port: number): Promise<Duplex>;
  /** Runs a command in a running box and collects its output. */
  exec(boxId: string, req: ExecRequest): Promise<ExecResult>;
  /** Changes the cgroup limits of a running box at once. */
  updateLimits(boxId: string, limits: BoxLimits): Promise<void>;
  listSnapshots(boxId: string): Promise<BoxSnapshotInfo[]>;
  /** A data volume's used bytes and its user snapshots, oldest first (docs/data.md). */
  volumeInfo(volumeId: string): Promise<VolumeInfoWire>;
  /** Removes a snapshot of the box's root (forks made from it keep working). Idempotent. */
  deleteSnapshot(boxId: string, name: string): Promise<void>;
  /** What a restore to `name` would take from others: later snapshots (names) and boxes forked
   *  from the root after it (box ids). */
  restoreBlockers(boxId: string, name: string): Promise<{ snapshots: string[]; forks: string[] }>;
  /** Writes a base tarball (plain or gzip) to the node's disk while checking every entry: a
   *  refused archive is 400 naming the entry, one too large 413; either leaves nothing. */
  stageBaseImport(data: Readable): Promise<StagedImport>;
  /** Removes a staged upload no job will take. Idempotent. */
  discardStagedImport(token: string): Promise<void>;
  /** A base's files as a plain tar stream (docs/bases.md "Export"). */
  exportBase(base: BaseRefWire): Promise<Readable>;
  /** Destroys the node's copy of a base; 409 while a box root on it depends on it. Idempotent. */
  destroyBase(base: BaseRefWire): Promise<void>;
}
