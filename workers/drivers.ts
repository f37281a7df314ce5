import type { BaseRef, IdMap, RootSource } from '../core/box';
import type { Readable, Writable } from 'node:stream';
import type { BoxSnapshotInfo, ExecRequest, ExecResult } from '../cluster/types';

export type { BaseRef, BoxSnapshotInfo, IdMap, RootSource };

/**
 * The narrow interfaces between job handlers and the host. One file per backend implements
 * each (workers/storage/zfs.ts, workers/runtime/runc.ts, workers/network/cni.ts). Every
 * mutating method is idempotent: job handlers are retried after a worker dies mid-way, so
 * "create what exists" and "destroy what is gone" must both succeed quietly.
 */

/** What a driver logs through (pino's logger fits). */
export interface DriverLogger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

/**
 * One bounded look at the storage (the storage watchdog's): `ok`; `dead` when what serves it is
 * gone (its daemon died, its pool is no longer imported, its mounts answer "not connected");
 * `hung` when it gave no answer in time; `error` for a pool that answers but is not usable
 * (FAULTED), which a restart would not mend.
 */
export interface StorageProbe {
  state: 'ok' | 'dead' | 'hung' | 'error';
  /** What was seen, for logs and the node's admin view (never for project tokens). */
  detail: string;
  /** For `hung`: `only-mounts` when the pool's daemon answered and only the statfs of its
   *  mounted root did not (a data path slowed by heavy destroys, or stuck). */
  scope?: 'daemon' | 'only-mounts';
}

export interface StorageDriver {
  /** Makes sure the pool exists (a loop-file pool in the data dir when none is configured),
   *  and the layout datasets under it. */
  init(): Promise<void>;
  /** Throws when the pool is not usable. */
  health(): Promise<void>;
  /** Bytes the pool can hold for boxes (used + available). */
  capacityBytes(): Promise<number>;
  /** How many box roots the node can hold in all (what its storage can mount), or null when
   *  only space bounds them. Cheap, and answers while the storage hangs. */
  rootLimit(): Promise<number | null>;
  /** Never throws, never takes (much) longer than `timeoutMs`. */
  probe(timeoutMs: number): Promise<StorageProbe>;
  /** Whether `restart` can bring a dead or hung storage back (a daemon this host runs). */
  readonly restartable: boolean;
  /**
   * Brings the storage back after `probe` found it dead or hung: the daemon killed for good and
   * started again, the pool imported, its datasets mounted. Box roots come back mounted but not
   * yet nosuid,nodev: `prepareBoxRoot` makes them so at the box's next start, which is what a
   * box whose root went away needs anyway (its container was cut off from the old mount).
   */
  restart(): Promise<void>;

  hasBase(base: BaseRef): Promise<boolean>;
  /** Creates a base dataset, lets `fill` write the root filesystem into the mounted directory,
   *  then takes the immutable snapshot boxes are cloned from. Idempotent: a half-made base
   *  (no snapshot yet) is destroyed and made again. */
  createBase(base: BaseRef, fill: (dir: string) => Promise<void>): Promise<void>;
  /** Destroys a base; throws if box roots still depend on it. */
  destroyBase(base: BaseRef): Promise<void>;
  baseSizeBytes(base: BaseRef): Promise<number>;
  /** The mounted, read-only directory of a base's files (what an export reads). */
  baseRootPath(base: BaseRef): string;
  /** Holds the box's root as it is at this instant under an internal name (`tag`: [a-z0-9-]),
   *  for `baseFromBoxRoot`; the caller pauses a running box around it. Idempotent. */
  holdBoxRoot(boxId: string, tag: string): Promise<void>;
  /**
   * Makes `base` from a held root: its files copied into the base's dataset, owners moved from
   * the box's id range back to box ids (0…65535), then the hold dropped. Idempotent: a base
   * already made only drops the hold; a half-made one is made again.
   */
  baseFromBoxRoot(boxId: string, tag: string, base: BaseRef): Promise<void>;
  /** Drops a hold (a save that failed for good). Idempotent. */
  releaseBoxRoot(boxId: string, tag: string): Promise<void>;

  /** Clones a new box root from `source`, with `storageGb` as its quota; answers the mounted
   *  directory. With `idMap`, a root from a base is cloned from that base's copy shifted into
   *  the id range (made once per range and kept); a fork's source is in the range already.
   *  Idempotent (an existing root is kept). */
  createBoxRoot(boxId: string, source: RootSource, storageGb?: number, idMap?: IdMap): Promise<string>;
  /** The mounted directory of a box root (need not exist). */
  boxRootPath(boxId: string): string;
  /** Where a root made now in `idMap`'s range is mounted (`boxRootPath` may be a link to it; a
   *  root of an older layout may be mounted elsewhere until its next start). */
  boxRootMount(boxId: string, idMap: IdMap): string;
  hasBoxRoot(boxId: string): Promise<boolean>;
  /**
   * Readies an existing root for a start in `idMap`: a root made before user namespaces (no
   * `boxhost:idmap`) has its files shifted into the range in place, once; its mount is made
   * nosuid,nodev where the storage did not. Cheap for a root already in the range. Answers the
   * directory the root is mounted at (no symlink on the way: what a container's root must be).
   */
  prepareBoxRoot(boxId: string, idMap: IdMap): Promise<string>;
  /** Destroys a box root and its snapshots. Forks made from it keep working (their origin is
   *  promoted away first). Idempotent. */
  destroyBoxRoot(boxId: string): Promise<void>;
  /** Ids of all box roots in the pool (for reconciliation). */
  listBoxRoots(): Promise<string[]>;

  /** Takes a user snapshot of the root (`description`: one line, kept with it). Idempotent. */
  snapshotBoxRoot(boxId: string, snapshot: string, description?: string): Promise<void>;
  /** Forks made from it keep working (its blocks stay, under an internal name, until they go). */
  destroyBoxSnapshot(boxId: string, snapshot: string): Promise<void>;
  /** User snapshots, oldest first. */
  listBoxSnapshots(boxId: string): Promise<BoxSnapshotInfo[]>;
  /** What a rollback to `snapshot` would destroy that others use: later user snapshots, and
   *  boxes forked from the root after it (box ids). */
  rollbackBlockers(boxId: string, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }>;
  /** Brings the root back to `snapshot`, its container stopped; refused (StorageInUseError)
   *  while `rollbackBlockers` names anything. Idempotent. */
  rollbackBoxRoot(boxId: string, snapshot: string): Promise<void>;
}

/** A data volume's state as its node sees it (its snapshots are the user's, oldest first). */
export interface VolumeInfo {
  usedBytes: number;
  snapshots: BoxSnapshotInfo[];
}

/** What a backup stream came to once written: its bytes and their sha256 (hex). */
export interface BackupStreamInfo {
  bytes: number;
  sha256: string;
}

/**
 * Data volumes on one node (docs/data.md): a dataset each, with a quota that counts its
 * snapshots, mounted on the host and bound into the boxes it is attached to. Backups are
 * `zfs send` streams of internal snapshots (`_bk-<backup>`), restored by receiving their chain
 * into a new dataset that then takes the volume's place. Idempotent like StorageDriver.
 */
export interface VolumeDriver {
  createVolume(volumeId: string, quotaGb: number): Promise<void>;
  /** Destroys the volume with its snapshots. Idempotent. */
  destroyVolume(volumeId: string): Promise<void>;
  /** Destroys it as destroyVolume does when `ok()`, asked under the lock that orders this pool's
   *  changes (so no restore swaps a dataset in between the answer and the destroy); answers
   *  what `ok()` said. A node letting go of a volume that moved away. */
  destroyVolumeIf(volumeId: string, ok: () => Promise<boolean>): Promise<boolean>;
  hasVolume(volumeId: string): Promise<boolean>;
  /** The volume's mounted directory on the host (what a box's bind mount takes). */
  volumePath(volumeId: string): string;
  /** Mounts it (nosuid,nodev) and hands its top directory to root of the id range when it is
   *  not in the range yet (a new volume), so the box can write to it. */
  prepareVolume(volumeId: string, idMap?: IdMap): Promise<void>;
  info(volumeId: string): Promise<VolumeInfo>;
  snapshotVolume(volumeId: string, snapshot: string, description?: string): Promise<void>;
  destroyVolumeSnapshot(volumeId: string, snapshot: string): Promise<void>;
  /** Rolls the volume back to a user snapshot; later internal (backup) snapshots go with it,
   *  later user snapshots must be gone (the caller checks). */
  rollbackVolume(volumeId: string, snapshot: string): Promise<void>;
  /** Takes the backup's internal snapshot (idempotent) and whether the one of `parent` is still
   *  there (an incremental needs it). */
  holdForBackup(volumeId: string, backup: string): Promise<void>;
  hasBackupSnapshot(volumeId: string, backup: string): Promise<boolean>;
  /** Writes `zfs send` of the backup's snapshot (incremental from `parent`'s when given) to
   *  `file` (through `file.part`, renamed at the end); answers its size and sha256. */
  sendBackup(volumeId: string, backup: string, parent: string | null, file: string, progress?: (bytes: number) => void): Promise<BackupStreamInfo>;
  /**
   * Replaces the volume's dataset by the chain of backup streams `files` (a full one, then
   * incrementals in order) received into a new dataset; `token` names this restore so a retry
   * knows what it already did. The quota is set again. Idempotent.
   */
  receiveBackups(volumeId: string, files: string[], quotaGb: number, token: string): Promise<void>;
  /** Drops internal backup snapshots no longer wanted (a backup deleted). Idempotent. */
  dropBackupSnapshot(volumeId: string, backup: string): Promise<void>;
  /** Drops every backup snapshot but `keep`'s (the next incremental's base): the others would
   *  hold blocks against the quota for nothing, a restore reads the streams. Idempotent. */
  pruneBackupSnapshots(volumeId: string, keep: string): Promise<void>;
  /** Undoes a restore cut off for good: the old dataset back in place when the swap was
   *  half-done, the half-received one destroyed. Idempotent. */
  abandonRestore(volumeId: string): Promise<void>;
  /** Ids of the volumes in the pool (for reconciliation). */
  listVolumes(): Promise<string[]>;
}

export interface NetworkAttachment {
  /** /run/netns/… path the container joins. */
  netnsPath: string;
  /** The box's IPv4 address on its project bridge. */
  address: string;
  gateway: string;
}

/** The project's own L2 segment: boxes on one bridge reach each other, never another bridge. */
export interface ProjectNetwork {
  /** Which block of BOXHOST_BOX_SUBNET is the project's (core/netblocks.ts); allocated by the db. */
  index: number;
}

export interface NetworkDriver {
  /** Host-wide set-up (firewall chains, sysctls). Idempotent. */
  init(): Promise<void>;
  /** Where the box's netns is (whether or not it exists). */
  netnsPath(boxId: string): string;
  /** Creates the box's empty netns and answers its path, so the container can be created in
   *  it while `attach` wires it up. Idempotent. */
  prepare(boxId: string): Promise<string>;
  /** Creates the box's netns if needed and joins it to its project's bridge, and brings its
   *  loopback up unless `opts.loopbackUp` says it is already. Idempotent: an attached box
   *  answers its existing attachment. */
  attach(boxId: string, net: ProjectNetwork, opts?: { loopbackUp?: boolean }): Promise<NetworkAttachment>;
  /** Removes the box from the bridge and deletes its netns; frees its address. Idempotent. */
  detach(boxId: string, net: ProjectNetwork): Promise<void>;
  /** Box ids that have a netns on this host (for reconciliation). */
  listAttached(): Promise<string[]>;
  /** Lets the box (at `address`) open TCP connections to `port` on its bridge's gateway address
   *  (the node's package-source proxy, for a base build's script) until `closeSources` or its
   *  `detach`; answers that gateway address. Replaces what was open for it. Idempotent. */
  openSources(boxId: string, address: string, port: number): Promise<string>;
  /** Takes back what `openSources` opened for the box. Idempotent. */
  closeSources(boxId: string): Promise<void>;
  /** Removes a project's bridge and its rules once no box of the project is on it; answers
   *  false (and changes nothing) while one still is. Idempotent. */
  releaseProject(net: ProjectNetwork): Promise<boolean>;
}

export interface ContainerSpec {
  boxId: string;
  hostname: string;
  /** Mounted box root directory. */
  rootfs: string;
  netnsPath: string;
  cpus: number;
  ramMb: number;
  /** Box-level environment; also written to /etc/boxes-env inside the box. */
  environment: Record<string, string>;
  /** Extra bind mounts (data volumes). */
  mounts: { source: string; destination: string; readOnly: boolean }[];
  /** The user namespace's mapping: box ids 0…size-1 are host ids hostId…; absent: none. */
  idMap?: IdMap;
  /** The root (and the volumes) being readied, by a create's clone or the start itself: what
   *  the start needs them not for (the bundle) is done meanwhile, and the container is made
   *  only once it resolves. Its rejection fails the start with nothing run. It may resolve to
   *  the root's real directory (`prepareBoxRoot`'s answer), which the start then takes for
   *  `rootfs` without asking the filesystem to resolve it. */
  rootReady?: Promise<unknown>;
  /** Where a root still being made (a create's) will be mounted: the container's config is
   *  written for it meanwhile, and again if `rootReady` names another directory. */
  expectedRootfs?: string;
}

export type ContainerStatus = 'created' | 'running' | 'paused' | 'stopped';

/** Exec options and result are the node protocol's own (`cluster/types.ts`). */
export type ExecOptions = ExecRequest;
export type { ExecResult };

/** A streaming exec: what `execStream` starts (never detached). */
export interface ExecStreamOptions {
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  tty?: boolean;
  /** Kill the process after this long; its exit code is 124 then. */
  timeoutMs?: number;
  /** Open a stdin stream to the process (its end, `stdin.end()`, is EOF for the process). */
  stdin?: boolean;
  /** Aborting it kills the process and its group (its caller went away): exit 137. */
  signal?: AbortSignal;
  /** With `signal`: aborting it with the reason EXEC_LET_GO lets go of the process instead of
   *  killing it (it runs on, its output dropped; a pipe stdin ends, a terminal stays open), and
   *  `exited` answers exit code -1; any other abort still kills. boxd only (1.3.0 on): a box
   *  whose agent predates it is told to restart (BoxNeedsRestartError). */
  noHup?: boolean;
}

/** The abort reason that lets go of a `noHup` process (ExecStreamOptions) rather than kill it. */
export const EXEC_LET_GO = 'boxhost:let-go';

/**
 * A process running in a box, its streams flowing as it runs: what HTTP exec collects now and
 * WebSocket exec will relay. Back-pressure is the streams' own (a reader that stops reading
 * stops the process's writes once the pipes fill).
 */
export interface ExecProcess {
  /** The process's stdin (null unless asked for). */
  stdin: Writable | null;
  stdout: Readable;
  /** Empty for a tty process: all its output comes on stdout. */
  stderr: Readable;
  /** The process's pid inside the box once known (0 if it never started). */
  pid(): Promise<number>;
  /** Sets the terminal size of a tty process (a no-op without tty). */
  resize(cols: number, rows: number): Promise<void>;
  /** Sends a signal to the process (e.g. `SIGTERM`). */
  signal(sig: NodeJS.Signals): void;
  /**
   * Settles when the process has exited and its output is drained: its exit code (128 + n
   * when killed by signal n; 124 when the timeout killed it). Rejects with ExecInputError when
   * the working directory could not be entered, BoxNotRunningError when the box is not
   * running.
   */
  exited: Promise<{ exitCode: number; timedOut: boolean }>;
}

export interface RuntimeDriver {
  /** Whether the netns at `netnsPath` is one `makeNetns` made for the box (cheap). */
  ownsNetns(boxId: string, netnsPath: string): Promise<boolean>;
  /** Replaces whatever is at `netnsPath` with a new netns, its loopback up and nothing else,
   *  that belongs to a new user namespace of the box mapped by `idMap` (the box joins both at
   *  start; the network driver wires the netns before). */
  makeNetns(boxId: string, netnsPath: string, idMap: IdMap): Promise<void>;
  /** Whether `makeNetns` made the netns at `netnsPath` with its loopback up (false for one made
   *  by an older version, which brought only the namespaces up). Cheap. */
  netnsLoopbackUp(boxId: string, netnsPath: string): Promise<boolean>;
  /** Writes the OCI bundle and starts the container detached (`runc run -d`). Idempotent:
   *  a running container is left alone; a stopped one is deleted and started again. */
  start(spec: ContainerSpec): Promise<void>;
  /** null when the container does not exist. */
  status(boxId: string): Promise<ContainerStatus | null>;
  /** SIGTERM to PID 1, SIGKILL after `graceSeconds`, then `runc delete`. Idempotent. */
  stop(boxId: string, graceSeconds: number): Promise<void>;
  /** Force-removes the container and its bundle and cgroups. Idempotent. */
  remove(boxId: string): Promise<void>;
  /** Freezes every process of a running container (`runc pause`, the cgroup freezer): a still
   *  moment for a consistent snapshot. A container that is not running is left as it is. */
  pause(boxId: string): Promise<void>;
  /** Thaws a paused container (`runc resume`); any other is left as it is. Idempotent. */
  unpause(boxId: string): Promise<void>;
  /** Live cgroup limits (`runc update`). */
  update(boxId: string, limits: { cpus?: number; ramMb?: number }): Promise<void>;
  /** Runs a command and collects its output (capped), or starts it detached. */
  exec(boxId: string, opts: ExecOptions): Promise<ExecResult>;
  /** Starts a command whose stdin, stdout and stderr the caller streams. */
  execStream(boxId: string, opts: ExecStreamOptions): Promise<ExecProcess>;
  /** Lets go of what no box holds any more (user namespaces whose netns is gone): run by
   *  reconciliation, off every box's own path. */
  tidy(): Promise<void>;
  /** Ids of containers this host's runc root knows (for reconciliation). */
  list(): Promise<{ boxId: string; status: ContainerStatus }[]>;
  /** Rewrites the box's /etc/boxes-env (running or not; a running box sees it at once). */
  writeEnvironment(boxId: string, environment: Record<string, string>): Promise<void>;
  /** The box's files, reached through its agent inside the box (paths are the box's own and
   *  resolve in it: docs/boxd.md "Files"). Errors: BoxFileError, BoxNotRunningError,
   *  BoxAgentUnavailableError. */
  files(boxId: string): Promise<BoxFiles>;
  /** The box's supervised services, kept by its agent in the box (docs/boxd.md "Services").
   *  Errors: BoxServiceError, BoxNotRunningError, BoxNeedsRestartError, BoxAgentUnavailableError. */
  services(boxId: string): Promise<BoxServices>;
  /** Whether the box's agent (boxd) answers within `timeoutMs`: `none` for a box without one
   *  (started before boxd) or not running; `unknown` when the node could not tell (its own
   *  failure, not the agent's). */
  probeAgent(boxId: string, timeoutMs: number): Promise<'ok' | 'none' | 'unresponsive' | 'unknown'>;
}

export const SERVICE_STATES = ['starting', 'running', 'restarting', 'stopped', 'exited', 'failed', 'corrupt'] as const;
export type BoxServiceStateName = (typeof SERVICE_STATES)[number];

/** A service spec as boxd persists it: boxd reads these fields; the node may add its own. */
export interface BoxServiceSpec {
  name: string;
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  restart?: 'always' | 'on-failure' | 'never';
  stop?: { signal?: string; grace_secs?: number };
  [field: string]: unknown;
}

export interface BoxServiceState {
  name: string;
  state: BoxServiceStateName;
  /** The main process's pid in the box (0: none running). */
  pid: number;
  restarts: number;
  lastExitCode: number | null;
  /** Set on a corrupt spec's tombstone: why it did not load. */
  error?: string;
  /** The spec file as it is (absent on a tombstone). Root in the box can write it: its fields
   *  are the box's word, to be checked again before the node acts on them. */
  spec?: Record<string, unknown>;
}

/** One readiness look at a port of the box's loopback (boxd 1.2.0 on): `http` a path fetched
 *  with GET, `status` the code wanted (absent: any 2xx); without `http`, a TCP connect. */
export interface BoxProbe {
  port: number;
  http?: string;
  status?: number;
}

export interface BoxProbeResult {
  ok: boolean;
  /** Why it did not pass. */
  issue?: string;
}

/** Service supervision in one box (workers/runtime/boxd/services.ts on the real runtime). */
export interface BoxServices {
  /** Starts `spec`, replacing a service of that name. */
  start(spec: BoxServiceSpec): Promise<{ service: BoxServiceState; replaced: boolean }>;
  /** Starts the stored spec again if it does not run (and enables it). */
  resume(name: string): Promise<BoxServiceState>;
  restart(name: string): Promise<BoxServiceState>;
  /** Stops it; `fail` marks it failed with that reason (a ready gate that did not pass). */
  stop(name: string, opts?: { signal?: string; graceMs?: number; fail?: string }): Promise<BoxServiceState>;
  get(name: string): Promise<BoxServiceState>;
  list(): Promise<BoxServiceState[]>;
  remove(name: string): Promise<void>;
  logs(name: string, opts?: { tail?: number; follow?: boolean }): Promise<Readable>;
  /** One readiness look at a port on the box's own loopback. */
  probe(p: BoxProbe): Promise<BoxProbeResult>;
}

/** What the runtime says of a path in a box (ids and paths are the box's own). */
export interface BoxFileInfo {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
  uid: number;
  gid: number;
  target?: string;
}

/** File operations in one box (workers/runtime/boxd/client.ts on the real runtime). */
export interface BoxFiles {
  stat(path: string): Promise<BoxFileInfo>;
  list(path: string): Promise<{ entries: BoxFileInfo[]; truncated: boolean }>;
  /** The file's info once opened, then its bytes streamed with back-pressure. */
  read(path: string): Promise<{ info: BoxFileInfo; data: Readable }>;
  /** A new file beside the target, renamed over it at the end: a write that fails leaves the
   *  old file (or none) at the path. */
  write(path: string, data: Readable, opts: { mode?: number; parents?: boolean }): Promise<BoxFileInfo>;
  remove(path: string, opts: { recursive?: boolean }): Promise<void>;
}
