/**
 * The calls the api makes into a node that cannot wait in a queue (DESIGN.md §1): one
 * interface, two transports. In-process when the node lives in the api's own process (no
 * network hop), HTTP to the node agent otherwise (`cluster/httpClient.ts`). Every error is a
 * `BoxhostError` of the contract: `invalid_argument` for a request the box cannot do,
 * `conflict` for a box that is not running, `unavailable` for a node that does not answer.
 */

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
}

export interface BoxLimits {
  cpus?: number;
  ramMb?: number;
}

export interface NodeClient {
  readonly nodeId: string;
  /** Runs a command in a running box and collects its output. */
  exec(boxId: string, req: ExecRequest): Promise<ExecResult>;
  /** Changes the cgroup limits of a running box at once. */
  updateLimits(boxId: string, limits: BoxLimits): Promise<void>;
  listSnapshots(boxId: string): Promise<BoxSnapshotInfo[]>;
}
