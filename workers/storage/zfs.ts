/**
 * Box storage on ZFS, spoken only through the `zfs` / `zpool` CLI so that the same code runs on
 * kernel ZFS and on Debian's zfs-fuse (pool version 23: no `zfs list -p`, no `clones` property,
 * no `.zfs` directory, destroys that report "dataset is busy" right after use).
 *
 * Layout under the root dataset R (the pool itself for the loop-file pool, `<pool/dataset>/boxhost`
 * for a configured one):
 *
 *   R/bases/<name>/<version>        a base's root filesystem, read-only once made
 *   R/bases/<name>/<version>@base   the snapshot every box root of that base is cloned from
 *   R/shifted/<name>/<version>/<hostId>        a base's copy with its files' owners shifted into
 *   R/shifted/<name>/<version>/<hostId>@base   the id range that starts at hostId (one per project
 *                                   range, made at first use, kept; see "Storage" in docs/decisions.md)
 *   R/boxes/<boxId>                 a box root: a clone of a base's (shifted) @base or of another
 *                                   box's snapshot; `boxhost:idmap` says which range its files are in
 *   R/boxes/<boxId>@<snapshot>      box snapshots (user names: a-z 0-9 -)
 *   R/boxes/<boxId>@_<...>          internal snapshots, never listed: fork points (`_fork-<newBoxId>`)
 *                                   and user snapshots that were deleted or whose box was deleted
 *                                   while forks still hang off them
 *   R/data/<volume>                 data volumes
 *
 * Internal snapshot names start with `_`, which the user name rule forbids, so they can never
 * collide with a user's snapshot, including after `zfs promote` moves snapshots between datasets.
 *
 * The driver is made of parts, one concern each: zfsDatasets.ts (every command, names, the pool
 * lock), zfsPool.ts (daemon, pool, health, restart), zfsBases.ts, zfsRoots.ts, zfsSnapshots.ts;
 * data volumes (zfsVolumes.ts) use the same datasets as their kit.
 */
import path from 'node:path';
import type { BaseRef, BoxSnapshotInfo, DriverLogger, IdMap, RootSource, StorageDriver, StorageProbe } from '../drivers';
import { checkComponent, noop } from './zfsCommon';
import { ZfsBases } from './zfsBases';
import { ZfsDatasets, type ZfsKit } from './zfsDatasets';
import { machineMountLock, ZfsFuseDaemon } from './zfsFuse';
import { ZfsPool } from './zfsPool';
import { ZfsRoots } from './zfsRoots';
import { ZfsBoxSnapshots } from './zfsSnapshots';

export { StorageInUseError } from './errors';
export type { ZfsKit } from './zfsDatasets';
export { DESCRIPTION_PROP, Gate, isBusy, isExists, isMissing, lines, quotaArg, ROOT_MOUNT_RESERVE, snapName, USER_SNAPSHOT } from './zfsCommon';

export interface ZfsStorageOptions {
  dataDir: string;
  /** A pool or `pool/dataset` to use; unset: a pool on a sparse file in the data dir. */
  pool?: string;
  poolSizeGb: number;
  hostTag: string;
  /** `zfs` commands run at once on this pool by this process (BOXHOST_ZFS_CONCURRENCY; 4). */
  concurrency?: number;
  /** The ARC cap (MB) of a zfs-fuse daemon this driver starts (BOXHOST_ZFS_FUSE_ARC_MB; 1024). */
  fuseArcMb?: number;
  /**
   * While the node starts, a command that gives no answer this long means a hung zfs-fuse: it is
   * restarted and the start tried once more (unset: no restart, commands wait CMD_TIMEOUT_MS).
   */
  startHangMs?: number;
  logger?: DriverLogger;
}

export class ZfsStorage implements StorageDriver {
  /** The pool name (first component of the configured pool, or `boxhost-<hostTag>`). */
  readonly pool: string;
  /** The root dataset R that holds bases/, boxes/ and data/. */
  readonly root: string;
  /** True when the pool is the loop-file pool this driver makes and may destroy. */
  readonly ownsPool: boolean;
  readonly imagePath: string;

  private readonly datasets: ZfsDatasets;
  private readonly poolPart: ZfsPool;
  private readonly bases: ZfsBases;
  private readonly roots: ZfsRoots;
  private readonly snapshots: ZfsBoxSnapshots;

  constructor(opts: ZfsStorageOptions) {
    let pool: string;
    if (opts.pool) {
      if (!/^[A-Za-z][A-Za-z0-9_.:-]*(\/[A-Za-z0-9_.:-]+)*$/.test(opts.pool)) throw new Error(`invalid ZFS pool ${JSON.stringify(opts.pool)}`);
      pool = opts.pool.split('/')[0];
      this.root = `${opts.pool}/boxhost`;
      this.ownsPool = false;
    } else {
      checkComponent('host tag', opts.hostTag);
      pool = `boxhost-${opts.hostTag}`;
      this.root = pool;
      this.ownsPool = true;
    }
    this.pool = pool;
    const log = opts.logger ?? { debug: noop, info: noop, warn: noop };
    const zfsDir = path.join(path.resolve(opts.dataDir), 'zfs');
    const daemon = new ZfsFuseDaemon(log, opts.fuseArcMb);
    this.datasets = new ZfsDatasets({
      pool,
      root: this.root,
      mountRoot: path.join(zfsDir, 'mnt'),
      lockFile: path.join(zfsDir, 'pool.lock'),
      concurrency: opts.concurrency,
      log,
      daemonPid: () => daemon.pid(),
      mountLock: machineMountLock(),
    });
    this.bases = new ZfsBases(this.datasets);
    this.poolPart = new ZfsPool(this.datasets, daemon, {
      zfsDir,
      ownsPool: this.ownsPool,
      poolSizeGb: opts.poolSizeGb,
      startHangMs: opts.startHangMs,
      log,
      onRestart: () => {
        this.bases.forget();
        this.roots.forget();
      },
    });
    this.imagePath = this.poolPart.imagePath;
    this.roots = new ZfsRoots(this.datasets, this.bases);
    this.snapshots = new ZfsBoxSnapshots(this.datasets);
  }

  // ---------------------------------------------------------------- pool

  init(): Promise<void> {
    return this.poolPart.init();
  }
  health(): Promise<void> {
    return this.poolPart.health();
  }
  /** zfs-fuse serves the pool (installed, and no kernel module's /dev/zfs). */
  get restartable(): boolean {
    return this.poolPart.restartable;
  }
  rootLimit(): Promise<number | null> {
    return this.poolPart.rootLimit();
  }
  probe(timeoutMs: number): Promise<StorageProbe> {
    return this.poolPart.probe(timeoutMs);
  }
  restart(): Promise<void> {
    return this.poolPart.restart();
  }
  capacityBytes(): Promise<number> {
    return this.poolPart.capacityBytes();
  }
  /** Destroys the loop-file pool this driver made and removes its image (tests, cleanup).
   *  Refuses a configured pool. */
  async destroyPool(): Promise<void> {
    // A pool made again in this process has none of the old one's ranges or fresh roots.
    this.bases.forget();
    this.roots.forget();
    await this.poolPart.destroyPool();
  }

  // ---------------------------------------------------------------- bases

  hasBase(base: BaseRef): Promise<boolean> {
    return this.bases.hasBase(base);
  }
  createBase(base: BaseRef, fill: (dir: string) => Promise<void>): Promise<void> {
    return this.bases.createBase(base, fill);
  }
  destroyBase(base: BaseRef): Promise<void> {
    return this.bases.destroyBase(base);
  }
  baseSizeBytes(base: BaseRef): Promise<number> {
    return this.bases.baseSizeBytes(base);
  }
  baseRootPath(base: BaseRef): string {
    return this.bases.baseRootPath(base);
  }
  holdBoxRoot(boxId: string, tag: string): Promise<void> {
    return this.bases.holdBoxRoot(boxId, tag);
  }
  baseFromBoxRoot(boxId: string, tag: string, base: BaseRef): Promise<void> {
    return this.bases.baseFromBoxRoot(boxId, tag, base);
  }
  releaseBoxRoot(boxId: string, tag: string): Promise<void> {
    return this.bases.releaseBoxRoot(boxId, tag);
  }

  // ---------------------------------------------------------------- box roots

  createBoxRoot(boxId: string, source: RootSource, storageGb?: number, idMap?: IdMap): Promise<string> {
    return this.roots.createBoxRoot(boxId, source, storageGb, idMap);
  }
  prepareBoxRoot(boxId: string, idMap: IdMap): Promise<string> {
    return this.roots.prepareBoxRoot(boxId, idMap);
  }
  boxRootMount(boxId: string, idMap: IdMap): string {
    return this.roots.boxRootMount(boxId, idMap);
  }

  boxRootPath(boxId: string): string {
    return this.roots.boxRootPath(boxId);
  }
  hasBoxRoot(boxId: string): Promise<boolean> {
    return this.roots.hasBoxRoot(boxId);
  }
  destroyBoxRoot(boxId: string): Promise<void> {
    return this.roots.destroyBoxRoot(boxId);
  }
  listBoxRoots(): Promise<string[]> {
    return this.roots.listBoxRoots();
  }

  // ---------------------------------------------------------------- box snapshots

  snapshotBoxRoot(boxId: string, snapshot: string, description?: string): Promise<void> {
    return this.snapshots.snapshotBoxRoot(boxId, snapshot, description);
  }
  rollbackBlockers(boxId: string, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }> {
    return this.snapshots.rollbackBlockers(boxId, snapshot);
  }
  rollbackBoxRoot(boxId: string, snapshot: string): Promise<void> {
    return this.snapshots.rollbackBoxRoot(boxId, snapshot);
  }
  destroyBoxSnapshot(boxId: string, snapshot: string): Promise<void> {
    return this.snapshots.destroyBoxSnapshot(boxId, snapshot);
  }
  listBoxSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    return this.snapshots.listBoxSnapshots(boxId);
  }

  /** The primitives data volumes are made of (workers/storage/zfsVolumes.ts), on this pool. */
  kit(): ZfsKit {
    return this.datasets;
  }
}
