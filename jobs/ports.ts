import type { BaseRef, RootSource } from '../core/box';
import type { BoxRecord } from '../db/repos/boxes';
import type { ServiceStartRequest } from '../core/apiTypes';

/**
 * What box jobs need from the node they run on. `workers/boxSteps.ts` implements it with the
 * node's drivers (and a test with fake ones); every step is idempotent, so a job retried after
 * a worker died mid-way finds what it had already made and goes on.
 */
export interface BoxHost {
  /** Clones the box's root from `source` (with its storage quota) and makes its empty netns. */
  createRoot(box: BoxRecord, source: RootSource): Promise<void>;
  /** createRoot, then start (its address not recorded: a create writes it with `running`),
   *  with what the start needs no root for done beside the clone. `stillWanted` is asked once
   *  the root is there; when it says no, nothing is started and the answer is null. */
  create(box: BoxRecord, source: RootSource, stillWanted: () => Promise<boolean>): Promise<string | null>;
  /** Starts the container and joins it to the project network; answers the box's address and
   *  records it on the row unless `recordAddress` is false (a create writes it with `running`). */
  start(box: BoxRecord, opts?: { recordAddress?: boolean }): Promise<string>;
  /** Whether the box's root is on the node (a create that failed for good removed it). */
  hasRoot(box: BoxRecord): Promise<boolean>;
  /** SIGTERM, SIGKILL after the box's grace period; the root is kept. */
  stop(box: BoxRecord): Promise<void>;
  /** Takes a snapshot of the box's root; a running box is paused for its instant and resumed
   *  even when the snapshot fails. Idempotent (a retry finds the snapshot made). */
  snapshot(box: BoxRecord, name: string, description?: string): Promise<void>;
  /** What a restore to `snapshot` would take from others: later snapshots (names) and boxes
   *  forked after it (box ids). */
  restoreBlockers(box: BoxRecord, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }>;
  /** Stops the container, rolls the root back to `snapshot`, starts the box again. */
  restore(box: BoxRecord, snapshot: string): Promise<void>;
  /** Removes everything the box holds on the node: container, network, datasets. */
  destroy(box: Pick<BoxRecord, 'id' | 'project'>): Promise<void>;
  /** Starts (or replaces) a service in the running box by its boxd and waits for its ready gate,
   *  as the service start route does (docs/services.md); its refusals are BoxhostErrors. */
  startService(box: BoxRecord, req: ServiceStartRequest): Promise<void>;
}

/** What base jobs need from the node they run on (`workers/baseSteps.ts`); idempotent steps. */
export interface BaseHost {
  /** Holds the box's root at one instant (a running box paused for it, thawed even on failure)
   *  and makes base `ref` from it; answers the base's size in bytes. */
  saveFromBox(box: BoxRecord, ref: BaseRef): Promise<number>;
  /** What a save that failed for good left: the root's hold, a half-made base. */
  abandonSave(boxId: string, ref: BaseRef): Promise<void>;
  /** Unpacks the upload staged as `token` into base `ref`; answers its size in bytes. */
  importStaged(token: string, ref: BaseRef): Promise<number>;
  /** Makes recipe base `ref` (`debian`) on this node unless it is there; true when made now. */
  makeRecipe(ref: BaseRef): Promise<boolean>;
  /** Removes a staged upload. Idempotent. */
  discardStaged(token: string): Promise<void>;
  /** Destroys base `ref` on this node (refused while box roots depend on it). Idempotent. */
  destroy(ref: BaseRef): Promise<void>;
  /** Runs a build script as root in a running box (`/bin/sh -c`), its output handed to
   *  `output` as it comes, at most `maxLogBytes` of it (then a note that it was cut). */
  runScript(box: BoxRecord, script: string, output: (text: string) => Promise<void>, maxLogBytes: number): Promise<{ exitCode: number; timedOut: boolean }>;
}

/** One stream of a restore's chain: where it is and the sha256 it was written with. */
export interface BackupStream {
  backup: string;
  sha256: string;
}

/** What data volume jobs need from the node they run on (`workers/volumeSteps.ts`). */
export interface VolumeHost {
  /** The node whose volumes these are (a move checks it runs where it was sent). */
  readonly nodeId: string;
  create(volumeId: string, quotaGb: number): Promise<void>;
  destroy(volumeId: string): Promise<void>;
  usedBytes(volumeId: string): Promise<number>;
  snapshot(volumeId: string, name: string, description?: string): Promise<void>;
  deleteSnapshot(volumeId: string, name: string): Promise<void>;
  /** Back to a user snapshot (the caller made sure no later user snapshot is in the way). */
  rollback(volumeId: string, snapshot: string): Promise<void>;
  /** Whether the snapshot of an earlier backup is still on the volume (an incremental's base). */
  hasBackupBase(volumeId: string, backup: string): Promise<boolean>;
  /** Snapshots the volume for `backup` and writes its stream (incremental on `parent`) to the
   *  backup directory, with a manifest beside it. */
  backup(volumeId: string, backup: { name: string; parent: string | null; description: string | null }, progress: (bytes: number) => void): Promise<{ bytes: number; sha256: string }>;
  /** Checks every stream of `chain` against its sha256 first (a mismatch refuses the restore
   *  before the volume is touched), then receives them in place of the volume. */
  restore(volumeId: string, chain: BackupStream[], quotaGb: number, token: string): Promise<void>;
  /** A backup that failed for good: its snapshot and partial file go. */
  abandonBackup(volumeId: string, backup: string): Promise<void>;
  /** A restore that failed for good: the volume as it was before it (docs/data.md). */
  abandonRestore(volumeId: string): Promise<void>;
}
