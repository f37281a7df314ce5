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
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { CommandError, run, sleep, type RunResult } from '../../core/command';
import { settleWithin } from '../../core/timeout';
import { shiftTree, unshiftTree } from '../bases/idShift';
import { ID_RANGE_SIZE } from '../../core/box';
import type { BaseRef, DriverLogger, IdMap, RootSource, StorageDriver, StorageProbe } from '../drivers';
import { fuseMountsOf, isPrivateMount, mountedUnder, mountFlags, processAlive, removeEmptyDirs } from './hostFs';
import { isDaemonDown, ROOTS_PER_ARC_MB, ZFS_FUSE, ZFS_FUSE_MAX_MOUNTS, ZfsFuseDaemon, zfsFuseMounts } from './zfsFuse';

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

/** ZFS primitives of one pool, shared by the box storage and data volumes. */
export interface ZfsKit {
  /** The root dataset R. */
  root: string;
  /** Where R is mounted (it may move when the storage restarts). */
  mountRoot(): string;
  zfsBin: string;
  zfs(args: string[], allowFailure?: boolean): Promise<RunResult>;
  exists(name: string): Promise<boolean>;
  prop(name: string, property: string): Promise<string>;
  props(names: string[], properties: string[], setOnly?: boolean): Promise<Map<string, Map<string, string>>>;
  ensureMounted(ds: string): Promise<void>;
  /** Makes a mount nosuid,nodev where the storage did not. */
  mountPrivately(dir: string): Promise<void>;
  snapshotsOf(ds: string): Promise<string[]>;
  destroySnapshot(snap: string): Promise<void>;
  destroyDataset(ds: string): Promise<void>;
  retryBusy(what: string, attempt: () => Promise<RunResult | null>): Promise<void>;
  /** Runs `fn` after every earlier serialized call on this pool in this process. */
  serialized<T>(fn: () => Promise<T>): Promise<T>;
}

export interface BoxSnapshotInfo {
  name: string;
  /** RFC 3339 UTC with milliseconds. */
  createdAt: string;
  sizeBytes: number;
  description?: string;
}

/** A base still has box roots cloned from it; the API answers 409. */
export class StorageInUseError extends Error {
  readonly code = 'conflict';
  override readonly name = 'StorageInUseError';
  constructor(message: string, readonly dependents: string[]) {
    super(message);
  }
}

/** zfs-fuse mounts kept for what a node mounts besides box roots once it runs (`rootLimit`). */
export const ROOT_MOUNT_RESERVE = 16;
// zfs-fuse can hang when its daemon wedges; a bounded wait turns that into an error.
const CMD_TIMEOUT_MS = 120_000;
// "dataset is busy" right after use clears within ~10-30 ms here; 12 tries cover ~6 s.
const BUSY_TRIES = 12;
const BASE_SNAPSHOT = 'base';
const INTERNAL = '_';
/** User property of a box root (and its snapshots): the first host id of the range its files
 *  are owned in, or `none` (a snapshot taken before the root was shifted in place). */
const IDMAP_PROP = 'boxhost:idmap';
/** User property of a shifted base copy being made: `<pid>` of the process making it. */
const MAKER_PROP = 'boxhost:maker';
/** User property of a box snapshot: the description its maker gave (one line, no tabs). */
export const DESCRIPTION_PROP = 'boxhost:description';
/** Box roots (and data volumes) never honour setuid bits or device nodes. */
const PRIVATE_MOUNT = ['setuid=off', 'devices=off'];

const COMPONENT = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
export const USER_SNAPSHOT = /^[A-Za-z0-9][A-Za-z0-9.:-]{0,127}$/;

const noop = () => {};

export const isMissing = (text: string) => /does not exist|no such pool|could not find any snapshots/i.test(text);
export const isBusy = (text: string) => /is busy|device busy/i.test(text);
export const isExists = (text: string) => /already exists/i.test(text);

function checkComponent(what: string, value: string): void {
  if (!COMPONENT.test(value)) throw new Error(`invalid ${what} ${JSON.stringify(value)} for a ZFS dataset name`);
}
function checkTag(value: string): void {
  if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(value)) throw new Error(`invalid hold tag ${JSON.stringify(value)}`);
}
function checkUserSnapshot(value: string): void {
  if (!USER_SNAPSHOT.test(value)) throw new Error(`invalid snapshot name ${JSON.stringify(value)}`);
}

function binary(name: string): string {
  for (const dir of ['/usr/sbin', '/sbin', '/usr/local/sbin']) {
    const p = path.join(dir, name);
    if (fs.existsSync(p)) return p;
  }
  return name;
}

export class ZfsStorage implements StorageDriver {
  /** The pool name (first component of the configured pool, or `boxhost-<hostTag>`). */
  readonly pool: string;
  /** The root dataset R that holds bases/, boxes/ and data/. */
  readonly root: string;
  /** True when the pool is the loop-file pool this driver makes and may destroy. */
  readonly ownsPool: boolean;
  readonly imagePath: string;

  private readonly zfsDir: string;
  private readonly defaultMount: string;
  private mountRoot: string;
  private readonly log: DriverLogger;
  private readonly zfsBin = binary('zfs');
  private readonly zpoolBin = binary('zpool');
  /** The create of each box root under way in this process (createBoxRoot: attempts take turns). */
  private readonly creatingRoots = new Map<string, Promise<string>>();
  /** Shifted base copies known to be complete: a box create then costs one `zfs clone`. */
  private readonly shiftedMade = new Set<string>();
  private readonly daemon: ZfsFuseDaemon;
  /** The probe's lookup in the boxes directory while it runs (`probe`). */
  private lookup?: Promise<RunResult>;
  /** How long a `zfs`/`zpool` command may run (shorter while the node starts: `init`). */
  private cmdTimeoutMs = CMD_TIMEOUT_MS;
  /** The daemon (its pid; null: none known) when a command was killed for giving no answer
   *  since `init` began; undefined: none was. */
  private hungDaemon: number | null | undefined;

  constructor(private readonly opts: ZfsStorageOptions) {
    const dataDir = path.resolve(opts.dataDir);
    this.zfsDir = path.join(dataDir, 'zfs');
    this.imagePath = path.join(this.zfsDir, 'pool.img');
    this.defaultMount = path.join(this.zfsDir, 'mnt');
    this.mountRoot = this.defaultMount;
    this.log = opts.logger ?? { debug: noop, info: noop, warn: noop };
    this.daemon = new ZfsFuseDaemon(this.log, opts.fuseArcMb);
    if (opts.pool) {
      if (!/^[A-Za-z][A-Za-z0-9_.:-]*(\/[A-Za-z0-9_.:-]+)*$/.test(opts.pool)) throw new Error(`invalid ZFS pool ${JSON.stringify(opts.pool)}`);
      this.pool = opts.pool.split('/')[0];
      this.root = `${opts.pool}/boxhost`;
      this.ownsPool = false;
    } else {
      checkComponent('host tag', opts.hostTag);
      this.pool = `boxhost-${opts.hostTag}`;
      this.root = this.pool;
      this.ownsPool = true;
    }
  }

  // ---------------------------------------------------------------- pool

  /**
   * Daemon, pool, layout. A zfs-fuse that gives no answer meanwhile (it has hung on its first
   * `zfs create` after a long life: CI, 2026-11-24) is killed, started anew and the start tried
   * once more: a node that cannot start has no watchdog yet to do it (startHangMs).
   */
  async init(): Promise<void> {
    const hangMs = this.opts.startHangMs;
    if (!hangMs || !this.restartable) return this.initOnce();
    this.cmdTimeoutMs = hangMs;
    this.hungDaemon = undefined;
    try {
      return await this.initOnce();
    } catch (e) {
      if (this.hungDaemon === undefined) throw e;
      this.log.warn({ err: (e as Error).message, hangMs }, `ZFS gave no answer within ${hangMs / 1000} s while the node started: restarting zfs-fuse`);
    } finally {
      this.cmdTimeoutMs = CMD_TIMEOUT_MS;
    }
    const hung = this.hungDaemon;
    // Kill, start, import and mount as one step beside the other nodes' restarts in this process.
    await serialized('zfs-fuse restart', () => this.restartOnce(hung));
    await this.initOnce();
  }

  private async initOnce(): Promise<void> {
    await this.ensureDaemon();
    if (this.restartable) {
      const arcMb = this.daemon.runningArcMb();
      if (arcMb * ROOTS_PER_ARC_MB < ZFS_FUSE_MAX_MOUNTS) {
        this.log.warn(
          { arcMb, roots: Math.floor(arcMb * ROOTS_PER_ARC_MB) },
          `the running zfs-fuse has an ARC of ${arcMb} MB, which holds about ${Math.floor(arcMb * ROOTS_PER_ARC_MB)} mounted filesystems: this node takes fewer boxes until zfs-fuse runs with max-arc-size ${Math.ceil(ZFS_FUSE_MAX_MOUNTS / ROOTS_PER_ARC_MB)} or more (/etc/zfs/zfsrc, or stop it and let boxhost start it)`,
        );
      }
    }
    if (this.ownsPool) await this.ensureLoopPool();
    else await this.ensureConfiguredPool();
    await this.ensureLayout();
    const mp = await this.prop(this.root, 'mountpoint');
    if (!path.isAbsolute(mp)) throw new Error(`dataset ${this.root} has mountpoint ${mp}; boxhost needs a mounted directory`);
    this.mountRoot = mp;
  }

  async health(): Promise<void> {
    const health = await this.poolHealth();
    if (health === null) throw new Error(`ZFS pool ${this.pool} is not imported`);
    if (health === 'DEGRADED') this.log.warn({ pool: this.pool }, 'ZFS pool is DEGRADED');
    else if (health !== 'ONLINE') throw new Error(`ZFS pool ${this.pool} is ${health}`);
    // Not through the gate: a health check that waited behind twenty creates' commands would
    // report a busy node's storage as failing.
    const mounted = await run([this.zfsBin, 'get', '-Hp', '-o', 'value', 'mounted', this.root], { timeoutMs: CMD_TIMEOUT_MS });
    if (mounted.stdout.trim() !== 'yes') throw new Error(`dataset ${this.root} is not mounted`);
    if (this.ownsPool) await this.checkPoolFileRoom();
  }

  /**
   * The loop-file pool is sparse: its file grows as boxes write, up to its size. When the host
   * filesystem can no longer hold that growth, writes in boxes would fail at random (or the
   * host fill up): the node reports it here, so it stops taking boxes before that.
   */
  private async checkPoolFileRoom(): Promise<void> {
    const [file, host] = await Promise.all([fs.promises.stat(this.imagePath), fs.promises.statfs(this.zfsDir)]);
    const allocated = file.blocks * 512;
    const growth = Math.max(0, file.size - allocated);
    const free = host.bavail * host.bsize;
    if (free < growth) {
      throw new Error(
        `the pool file ${this.imagePath} (${bytes(file.size)}, ${bytes(allocated)} allocated) can grow ${bytes(growth)} more, ` +
          `but its filesystem has only ${bytes(free)} free: free space there or move the data dir`,
      );
    }
  }

  /** zfs-fuse serves the pool (installed, and no kernel module's /dev/zfs). */
  get restartable(): boolean {
    return this.daemon.installed && !fs.existsSync('/dev/zfs');
  }

  /**
   * How many box roots this node can hold mounted in all, or null without a limit (kernel ZFS).
   * zfs-fuse mounts at most ZFS_FUSE_MAX_MOUNTS filesystems machine-wide, and its ARC holds
   * about ROOTS_PER_ARC_MB mounted filesystems in use per MB (past it the daemon hangs): the
   * lower of the two, less what every other mount takes (other pools, this pool's bases and
   * layout datasets) and a reserve for what this node mounts besides roots (a project's first
   * box mounts its shifted base). The node reports it with every heartbeat; admission counts
   * box rows against it (docs/security.md "Admission").
   */
  async rootLimit(): Promise<number | null> {
    if (!this.restartable) return null;
    const mounts = zfsFuseMounts();
    const roots = mounts.filter((m) => m.startsWith(`${this.root}/boxes/`)).length;
    const held = Math.min(ZFS_FUSE_MAX_MOUNTS, Math.floor(this.daemon.runningArcMb() * ROOTS_PER_ARC_MB));
    return Math.max(0, held - (mounts.length - roots) - ROOT_MOUNT_RESERVE);
  }

  /**
   * The watchdog's look: the pool's health from the daemon and a statfs of the mounted root,
   * side by side, each in a child process killed at the deadline (a statfs of a wedged FUSE
   * mount would otherwise hold one of Node's own threads for good).
   */
  async probe(timeoutMs: number): Promise<StorageProbe> {
    if (this.restartable && this.daemon.pid() === null) return { state: 'dead', detail: 'the zfs-fuse daemon is not running' };
    const deadline = { allowFailure: true, timeoutMs };
    const t0 = Date.now();
    const late = () => Date.now() - t0 >= timeoutMs - 50;
    // A child stuck in a FUSE request the daemon took but never answers cannot even be killed
    // (it waits uninterruptibly): the look gives up on it at the deadline and lets it be.
    const bounded = (argv: string[]) =>
      settleWithin(
        run(argv, deadline).catch((e: Error) => ({ exitCode: -1, stdout: '', stderr: e.message })),
        timeoutMs + 500,
        { exitCode: -2, stdout: '', stderr: 'no answer' },
      );
    // A name looked up in the boxes directory, where every root is mounted: a FUSE request
    // there that zfs-fuse never answers holds the directory's lock, and every later create,
    // start and lookup waits behind it, while `zpool list` and a statfs of the root still
    // answer (seen at 390 boxes). One lookup at a time: one that is stuck stays stuck until
    // the daemon dies, and later looks wait on it instead of adding more stuck processes.
    // A new name each time: zfs-fuse has the kernel cache a missing name (for an hour with
    // Debian's zfsrc), and a cached answer never reaches the daemon or waits on the lock.
    const name = `.boxhost-probe-${process.pid}-${Date.now().toString(36)}-${crypto.randomBytes(3).toString('hex')}`;
    this.lookup ??= run(['stat', '-c', '%i', path.join(this.mountRoot, 'boxes', name)], { allowFailure: true })
      .catch((e: Error) => ({ exitCode: -1, stdout: '', stderr: e.message }))
      .finally(() => (this.lookup = undefined));
    const [pool, fsys, lookup] = await Promise.all([
      bounded([this.zpoolBin, 'list', '-H', '-o', 'health', this.pool]),
      bounded(['stat', '-f', '-c', '%b', this.mountRoot]),
      settleWithin(this.lookup, timeoutMs + 500, { exitCode: -2, stdout: '', stderr: 'no answer' }),
    ]);
    if (pool.exitCode !== 0 && isDaemonDown(pool.stderr)) return { state: 'dead', detail: `ZFS does not answer: ${pool.stderr.trim()}` };
    if (pool.exitCode !== 0 && isMissing(pool.stderr)) return { state: 'dead', detail: `pool ${this.pool} is not imported` };
    if (/not connected/i.test(fsys.stderr) || /not connected/i.test(lookup.stderr)) return { state: 'dead', detail: `${this.mountRoot}: transport endpoint is not connected` };
    if ((pool.exitCode !== 0 || fsys.exitCode !== 0) && (late() || pool.exitCode === -2 || fsys.exitCode === -2)) {
      const daemon = pool.exitCode !== 0;
      return { state: 'hung', scope: daemon ? 'daemon' : 'only-mounts', detail: `no answer within ${timeoutMs} ms (${daemon ? 'zpool list' : 'statfs of the pool root'})` };
    }
    if (lookup.exitCode === -2) return { state: 'hung', scope: 'only-mounts', detail: `no answer within ${timeoutMs} ms (a lookup in ${this.mountRoot}/boxes)` };
    if (pool.exitCode !== 0) return { state: 'error', detail: `zpool list: ${pool.stderr.trim()}` };
    if (fsys.exitCode !== 0) return { state: 'error', detail: `statfs ${this.mountRoot}: ${fsys.stderr.trim()}` };
    const health = pool.stdout.trim();
    if (health !== 'ONLINE' && health !== 'DEGRADED') return { state: 'error', detail: `pool ${this.pool} is ${health}` };
    return { state: 'ok', detail: health };
  }

  /**
   * Kill, start, import, mount. The dead daemon's FUSE mounts of this pool are detached first
   * (lazily: a box may still hold one open), so the new daemon mounts over clean directories.
   */
  async restart(): Promise<void> {
    if (!this.daemon.installed) throw new Error(`${ZFS_FUSE} is not installed: only the ZFS kernel module serves this pool, which boxhost cannot restart`);
    // One restart at a time in this process (several nodes of a test machine share the daemon);
    // one that finds a daemon another restart already brought back only re-imports and mounts.
    await serialized('zfs-fuse restart', () => this.restartOnce());
  }

  /** @param hungPid the daemon that gave a starting node no answer (`init`): killed only if it
   *  still runs (another restart may have replaced it); unset: the watchdog's restart. */
  private async restartOnce(hungPid?: number | null): Promise<void> {
    if (hungPid !== undefined) {
      if (hungPid !== null && this.daemon.pid() === hungPid) await this.daemon.kill();
    } else {
      // The probe again, now: a mount of this pool that gives no answer, or the wrong one, means
      // the daemon serving it must go, even when it answers `zpool list`.
      const now = await this.probe(5000);
      if (now.state !== 'ok' || this.daemon.pid() === null) await this.daemon.kill();
    }
    await this.detachMounts();
    await this.ensureDaemon();
    if (this.ownsPool) await this.ensureLoopPool();
    else await this.ensureConfiguredPool();
    // An import mounts what it can; a dataset it could not (its directory was busy) is mounted now.
    await this.zfs(['mount', '-a'], true);
    this.shiftedMade.clear();
  }

  /** Detaches (lazily: a box may hold one open) this pool's mounts of a dead daemon. */
  private async detachMounts(): Promise<void> {
    for (const point of fuseMountsOf(this.pool)) {
      const r = await run(['umount', '-l', point], { allowFailure: true, timeoutMs: 30_000 });
      if (r.exitCode !== 0 && !/not mounted|no mount point/i.test(r.stderr)) this.log.warn({ point, err: r.stderr.trim() }, 'could not detach a mount of the dead daemon');
    }
  }

  /** What the pool can hold for boxhost: used + available of its root dataset. */
  async capacityBytes(): Promise<number> {
    const p = (await this.props([this.root], ['used', 'available'])).get(this.root);
    return Number(p?.get('used') ?? 0) + Number(p?.get('available') ?? 0);
  }

  /** Destroys the loop-file pool this driver made and removes its image (tests, cleanup).
   *  Refuses a configured pool. */
  async destroyPool(): Promise<void> {
    if (!this.ownsPool) throw new Error(`refusing to destroy configured pool ${this.pool}`);
    if ((await this.poolHealth()) !== null) {
      await this.retryBusy(`zpool destroy ${this.pool}`, async () => {
        const r = await this.zpool(['destroy', '-f', this.pool], true);
        if (r.exitCode !== 0 && !isMissing(r.stderr)) return r;
        return null;
      });
    }
    fs.rmSync(this.imagePath, { force: true });
    // Only empty directories go: a mount left behind must never be recursed into.
    if (!mountedUnder(this.zfsDir)) removeEmptyDirs(this.zfsDir);
  }

  // ---------------------------------------------------------------- bases

  async hasBase(base: BaseRef): Promise<boolean> {
    return this.exists(`${this.baseDataset(base)}@${BASE_SNAPSHOT}`);
  }

  async createBase(base: BaseRef, fill: (dir: string) => Promise<void>): Promise<void> {
    const ds = this.baseDataset(base);
    // In this process a second maker waits for the first; it would otherwise see a base being
    // filled as half-made and destroy it.
    await serialized(ds, () => this.makeBase(ds, fill));
  }

  private async makeBase(ds: string, fill: (dir: string) => Promise<void>): Promise<void> {
    if (await this.exists(`${ds}@${BASE_SNAPSHOT}`)) return;
    if (await this.exists(ds)) {
      this.log.warn({ dataset: ds }, 'half-made base (no @base snapshot): destroying it to start again');
      await this.destroyDataset(ds);
    }
    await this.zfsTolerating(['create', '-p', ds.slice(0, ds.lastIndexOf('/'))], isExists);
    // Without -p: when another process is making the same base, this fails instead of sharing it.
    await this.zfs(['create', ds]);
    try {
      await this.ensureMounted(ds);
      await fill(await this.prop(ds, 'mountpoint'));
      await this.zfs(['snapshot', `${ds}@${BASE_SNAPSHOT}`]);
    } catch (e) {
      await this.destroyDataset(ds).catch((err) => this.log.warn({ dataset: ds, err: String(err) }, 'cleanup of failed base failed'));
      throw e;
    }
    // Box roots are clones of @base; writes to the base itself would only confuse a later export.
    await this.zfs(['set', 'readonly=on', ds]);
  }

  /** Destroys a base and its shifted copies; refuses while a box root depends on any of them. */
  async destroyBase(base: BaseRef): Promise<void> {
    const ds = this.baseDataset(base);
    if (!(await this.exists(ds))) return;
    const copies = `${this.root}/shifted/${base.name}/${base.version}`;
    const dependents = (await this.descendantsOf(ds)).filter((d) => d !== copies && !d.startsWith(`${copies}/`));
    if (dependents.length > 0) {
      const names = dependents.map((d) => this.boxIdOf(d) ?? d);
      throw new StorageInUseError(`base ${base.name}@${base.version} is in use by ${names.length} box root(s): ${names.join(', ')}`, names);
    }
    for (const made of [...this.shiftedMade]) if (made.startsWith(`${copies}/`)) this.shiftedMade.delete(made);
    if (await this.exists(copies)) await this.destroyDataset(copies);
    await this.destroyDataset(ds);
    // The per-name parents go with their last version; a concurrent create makes this fail harmlessly.
    for (const parent of [`${this.root}/bases/${base.name}`, `${this.root}/shifted/${base.name}`]) {
      const children = await this.zfs(['list', '-H', '-o', 'name', '-r', '-d', '1', parent], true);
      if (children.exitCode === 0 && lines(children.stdout).length === 1) {
        await this.destroyDataset(parent, false).catch((e) => this.log.warn({ dataset: parent, err: String(e) }, 'left an empty base name dataset'));
      }
    }
  }

  async baseSizeBytes(base: BaseRef): Promise<number> {
    return Number(await this.prop(`${this.baseDataset(base)}@${BASE_SNAPSHOT}`, 'referenced'));
  }

  /** The mounted, read-only directory of a base (for export). */
  baseRootPath(base: BaseRef): string {
    this.baseDataset(base);
    return path.join(this.mountRoot, 'bases', base.name, base.version);
  }

  async holdBoxRoot(boxId: string, tag: string): Promise<void> {
    checkTag(tag);
    const hold = `${this.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    await this.zfsTolerating(['snapshot', hold], isExists);
  }

  /**
   * The held root cloned (read-only) under R/tmp, copied with `cp -a` into the base's dataset
   * (links, modes, owners kept), owners moved back from the range the root's `boxhost:idmap`
   * names; the clone and the hold destroyed whatever happened. A copy, not a clone: the base
   * must not depend on a box that may be deleted, nor the box on the base.
   */
  async baseFromBoxRoot(boxId: string, tag: string, base: BaseRef): Promise<void> {
    checkTag(tag);
    const hold = `${this.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    const tmp = `${this.root}/tmp/save-${boxId}-${tag}`;
    try {
      if (await this.hasBase(base)) return;
      if (!(await this.exists(hold))) throw new Error(`box root ${boxId} has no hold ${tag}`);
      const range = await this.prop(hold, IDMAP_PROP);
      await this.zfsTolerating(['create', '-p', `${this.root}/tmp`], isExists);
      if (await this.exists(tmp)) await this.destroyDataset(tmp);
      await this.zfs(['clone', '-o', 'readonly=on', hold, tmp]);
      await this.ensureMounted(tmp);
      const from = await this.prop(tmp, 'mountpoint');
      await this.createBase(base, async (dir) => {
        await run(['cp', '-a', '--', `${from}/.`, `${dir}/`], { timeoutMs: 60 * 60_000 });
        if (/^\d+$/.test(range)) await unshiftTree(dir, { hostId: Number(range), size: ID_RANGE_SIZE });
      });
    } finally {
      await this.destroyDataset(tmp).catch((e) => this.log.warn({ dataset: tmp, err: String(e) }, 'left a temporary clone of a saved root'));
      await this.destroySnapshot(hold).catch((e) => this.log.warn({ snapshot: hold, err: String(e) }, 'left the hold of a saved root'));
    }
  }

  async releaseBoxRoot(boxId: string, tag: string): Promise<void> {
    checkTag(tag);
    const hold = `${this.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    await this.destroyDataset(`${this.root}/tmp/save-${boxId}-${tag}`);
    await this.destroySnapshot(hold);
  }

  // ---------------------------------------------------------------- box roots

  /**
   * One `zfs clone` in the common case. With `idMap`, a root from a base is a clone of the base's
   * copy shifted into the range (made at the first box of the range, then kept); a fork is a
   * clone of its source, whose files are in the range already (`boxhost:idmap` of the origin
   * snapshot says so; an unshifted one is shifted at the fork's first start). Every root gets
   * `quota` (snapshots and forks' origins count) and `refquota` of `storageGb`, and inherits
   * setuid=off and devices=off; `prepareBoxRoot` makes its mount honour them before a start.
   */
  async createBoxRoot(boxId: string, source: RootSource, storageGb?: number, idMap?: IdMap): Promise<string> {
    // Attempts for one root in this process take turns: a later one finds what the earlier made.
    // Side by side, zfs-fuse's mounts of the same new dataset collided (4 at once from one driver:
    // 12 rounds of 40 failed, "directory is not empty", "failed to create mountpoint" or "busy";
    // 0 of 40 so, and 0 of 40 from 4 drivers, which the retry in ensureMounted covers).
    const before = this.creatingRoots.get(boxId);
    const mine = (async () => {
      await before?.catch(noop);
      return this.createBoxRootNow(boxId, source, storageGb, idMap);
    })();
    this.creatingRoots.set(boxId, mine);
    try {
      return await mine;
    } finally {
      if (this.creatingRoots.get(boxId) === mine) this.creatingRoots.delete(boxId);
    }
  }

  private async createBoxRootNow(boxId: string, source: RootSource, storageGb?: number, idMap?: IdMap): Promise<string> {
    const ds = this.boxDataset(boxId);
    if (storageGb !== undefined && !(Number.isFinite(storageGb) && storageGb > 0)) throw new Error(`invalid storage size ${storageGb} GB`);

    // What went wrong is read from the clone's failure.
    let origin: string;
    let missing: string;
    let madeForkSnapshot = false;
    let inRange: string | null = null;
    if (source.kind === 'base') {
      missing = `base ${source.base.name}@${source.base.version} does not exist`;
      if (idMap) {
        origin = `${await this.shiftedBase(source.base, idMap, missing)}@${BASE_SNAPSHOT}`;
        inRange = String(idMap.hostId);
      } else {
        origin = `${this.baseDataset(source.base)}@${BASE_SNAPSHOT}`;
      }
    } else {
      // Checked first: on a retry the source may be gone already (destroyed, fork promoted).
      if (await this.exists(ds)) {
        await this.ensureMounted(ds);
        return this.boxRootPath(boxId);
      }
      const src = this.boxDataset(source.boxId);
      // The range of the files cloned: a new snapshot's is its root's (read side by side).
      let range: Promise<RunResult>;
      if (source.snapshot !== undefined) {
        checkUserSnapshot(source.snapshot);
        origin = `${src}@${source.snapshot}`;
        missing = `box ${source.boxId} has no snapshot ${source.snapshot}`;
        range = this.zfs(['get', '-Hp', '-o', 'value', IDMAP_PROP, origin], true);
      } else {
        // Named after the new box so that a retried fork reuses its first snapshot.
        origin = `${src}@${INTERNAL}fork-${boxId}`;
        missing = `box root ${source.boxId} does not exist`;
        range = this.zfs(['get', '-Hp', '-o', 'value', IDMAP_PROP, src], true);
        const r = await this.zfs(['snapshot', origin], true);
        if (r.exitCode === 0) madeForkSnapshot = true;
        else if (isMissing(r.stderr)) throw new Error(missing);
        else if (!isExists(r.stderr)) throw new CommandError([this.zfsBin, 'snapshot', origin], r.exitCode, r.stdout, r.stderr);
      }
      const value = (await range).stdout.trim();
      if (/^\d+$/.test(value)) inRange = value;
    }

    // `setuid` and `devices` come from R/boxes. Each property given to the clone costs it ≈3 ms;
    // a `zfs set` after it ≈11 ms, and run beside the start it slows everything on zfs-fuse
    // (measured: create p50 1.73× the floor with them here, 1.93× set beside the start).
    const args = ['clone'];
    if (storageGb !== undefined) args.push('-o', `refquota=${quotaArg(storageGb)}`, '-o', `quota=${quotaArg(storageGb)}`);
    if (inRange !== null) args.push('-o', `${IDMAP_PROP}=${inRange}`);
    args.push(origin, ds);
    const r = await this.zfs(args, true);
    // "already exists": an earlier attempt made it (an existing root is kept as it is);
    // "successfully created, but not mounted": the clone is there, only the mount failed;
    // "cannot mount …" with the clone there: the clone was made and its mount met another's (an
    // attempt in another process, or one this process started before: zfs-fuse then answers
    // "busy", "directory is not empty" or "failed to create mountpoint"); mounted again below.
    const raced = r.exitCode !== 0 && /cannot mount/i.test(r.stderr) && (await this.exists(ds));
    if (r.exitCode === 0 || isExists(r.stderr) || /successfully created/i.test(r.stderr) || raced) {
      if (r.exitCode !== 0) await this.ensureMounted(ds);
      // Made nosuid,nodev now, beside the box's namespaces, rather than on its start's path.
      await this.mountPrivately(this.boxRootPath(boxId));
      return this.boxRootPath(boxId);
    }
    if (madeForkSnapshot) await this.dropIfUnused(origin).catch(noop);
    if (isMissing(r.stderr)) throw new Error(missing);
    throw new CommandError([this.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  async prepareBoxRoot(boxId: string, idMap: IdMap): Promise<void> {
    const dir = this.boxRootPath(boxId);
    // A mounted root whose top directory the range's root owns was made in the range: no ZFS
    // command needed (the property decides only when this says otherwise).
    const st = await fs.promises.stat(dir).catch(() => null);
    if (st?.uid !== idMap.hostId) await this.shiftIntoRange(boxId, idMap);
    await this.mountPrivately(dir);
  }

  private async shiftIntoRange(boxId: string, idMap: IdMap): Promise<void> {
    const ds = this.boxDataset(boxId);
    if (!(await this.exists(ds))) throw new Error(`box root ${boxId} does not exist`);
    await this.ensureMounted(ds);
    const range = await this.prop(ds, IDMAP_PROP);
    if (range === String(idMap.hostId)) return;
    if (/^\d+$/.test(range)) throw new Error(`box root ${boxId} is in the id range from ${range}, not ${idMap.hostId}`);
    // Made before user namespaces: its files (and what its snapshots hold, which stays as it
    // was: they are marked `none`, so a fork of one is shifted in turn) move into the range.
    const dir = this.boxRootPath(boxId);
    const t0 = Date.now();
    const snapshots = await this.snapshotsOf(ds);
    if (snapshots.length > 0) await this.zfs(['set', `${IDMAP_PROP}=none`, ...snapshots]);
    const { entries } = await shiftTree(dir, idMap);
    await this.zfs(['set', `${IDMAP_PROP}=${idMap.hostId}`, ds]);
    // Box roots of that version had only a refquota; snapshots now count as well.
    const refquota = await this.prop(ds, 'refquota');
    if (refquota !== '0' && (await this.prop(ds, 'quota')) === '0') await this.zfs(['set', `quota=${refquota}`, ds]);
    this.log.info({ boxId, hostId: idMap.hostId, entries, ms: Date.now() - t0 }, 'shifted a box root made before user namespaces into its id range');
  }

  /**
   * The base's copy in `idMap`'s range: `R/shifted/<name>/<version>/<hostId>`, a clone of the
   * base's @base with every owner shifted, and its own @base snapshot. Made once; a copy left
   * half-made (no @base) by a process that is gone is made again, one whose maker still runs
   * (another worker process) is waited for.
   */
  private async shiftedBase(base: BaseRef, idMap: IdMap, missing: string): Promise<string> {
    const ds = this.shiftedDataset(base, idMap);
    if (this.shiftedMade.has(ds)) return ds;
    await serialized(ds, async () => {
      for (let waited = 0; !(await this.exists(`${ds}@${BASE_SNAPSHOT}`)); waited += 250) {
        const maker = await this.zfs(['get', '-Hp', '-o', 'value', MAKER_PROP, ds], true);
        if (maker.exitCode !== 0) {
          await this.makeShiftedBase(base, ds, idMap, missing);
          continue;
        }
        const pid = Number(maker.stdout.trim());
        if (pid !== process.pid && processAlive(pid) && waited < 10 * 60_000) {
          await sleep(250);
          continue;
        }
        this.log.warn({ dataset: ds }, 'half-made shifted base copy: destroying it to start again');
        await this.destroyDataset(ds);
      }
    });
    this.shiftedMade.add(ds);
    return ds;
  }

  private async makeShiftedBase(base: BaseRef, ds: string, idMap: IdMap, missing: string): Promise<void> {
    await this.zfsTolerating(['create', '-p', ds.slice(0, ds.lastIndexOf('/'))], isExists);
    const origin = `${this.baseDataset(base)}@${BASE_SNAPSHOT}`;
    const r = await this.zfs(['clone', '-o', `${MAKER_PROP}=${process.pid}`, origin, ds], true);
    if (r.exitCode !== 0) {
      if (isExists(r.stderr)) return; // another process is making it: the caller waits
      if (isMissing(r.stderr)) throw new Error(missing);
      throw new CommandError([this.zfsBin, 'clone', origin, ds], r.exitCode, r.stdout, r.stderr);
    }
    const t0 = Date.now();
    await this.ensureMounted(ds);
    const { entries } = await shiftTree(await this.prop(ds, 'mountpoint'), idMap);
    await this.zfs(['snapshot', `${ds}@${BASE_SNAPSHOT}`]);
    await this.zfs(['set', 'readonly=on', ds]);
    this.log.info({ base: `${base.name}@${base.version}`, hostId: idMap.hostId, entries, ms: Date.now() - t0 }, "made a base's copy in an id range");
  }

  /** zfs-fuse mounts without nosuid,nodev whatever `setuid` and `devices` say: the mount is
   *  made so by a bind remount, which changes only its flags. */
  private async mountPrivately(dir: string): Promise<void> {
    const flags = await mountFlags(dir);
    if (!flags || isPrivateMount(flags)) return;
    await run(['mount', '-o', 'remount,bind,nosuid,nodev', dir]);
  }

  boxRootPath(boxId: string): string {
    checkComponent('box id', boxId);
    return path.join(this.mountRoot, 'boxes', boxId);
  }

  async hasBoxRoot(boxId: string): Promise<boolean> {
    return this.exists(this.boxDataset(boxId));
  }

  async destroyBoxRoot(boxId: string): Promise<void> {
    const ds = this.boxDataset(boxId);
    for (let attempt = 1; ; attempt++) {
      if (!(await this.exists(ds))) {
        // A fork that failed after its fork snapshot was taken leaves that snapshot on the source.
        await this.dropForkSnapshots(boxId);
        return;
      }
      await serialized(this.pool, () => this.promoteForks(ds));
      const origin = (await this.zfs(['get', '-Hp', '-o', 'value', 'origin', ds], true)).stdout.trim();
      try {
        await this.destroyDataset(ds);
      } catch (e) {
        // Another worker process promoted this root over its own origin meanwhile: detach again.
        if (attempt < 3 && /dependent clones/.test(String(e))) continue;
        throw e;
      }
      try {
        fs.rmdirSync(this.boxRootPath(boxId));
      } catch {
        // zfs-fuse removes the mountpoint itself; kernel ZFS may leave it
      }
      if (origin.includes('@')) await this.dropIfUnused(origin);
      return;
    }
  }

  /** Forks hang off this root's snapshots. `zfs promote` hands those snapshots (and every older
   *  one) to a fork, after which nothing depends on the root and it can go. Runs under a lock:
   *  two of these racing would promote a fork whose origin already moved, i.e. over its base. */
  private async promoteForks(ds: string): Promise<void> {
    for (let round = 0; ; round++) {
      // Only a snapshot can be cloned: a root without one (most are) has no fork to promote,
      // and this asks about the one dataset instead of listing every filesystem of the pool
      // (which made each delete cost grow with the box count: ~2 s at 1000 boxes on zfs-fuse).
      if ((await this.snapshotsOf(ds)).length === 0) return;
      const dependents = await this.snapshotClones(ds);
      if (dependents.size === 0) return;
      if (round >= 32) throw new Error(`box root ${ds}: forks still depend on it after ${round} promotions`);
      let newest: { snap: string; clone: string } | undefined;
      for (const snap of await this.snapshotsOf(ds)) {
        const clones = dependents.get(snap);
        if (!clones) {
          // It dies with the root anyway; destroying it now keeps promote from moving it.
          await this.destroySnapshot(snap);
          continue;
        }
        // Promote would carry user names onto the fork, where they could collide with its own.
        const kept = snapName(snap).startsWith(INTERNAL) ? snap : await this.hide(snap);
        newest = { snap: kept, clone: clones[0] };
      }
      if (!newest) continue;
      const fork = this.boxIdOf(newest.clone);
      if (!fork) throw new Error(`${newest.clone} is cloned from ${newest.snap} but is no box root; refusing to promote it`);
      // Promoting a clone whose origin is no longer ours would steal its new origin's snapshots.
      if ((await this.prop(newest.clone, 'origin')) !== newest.snap) continue;
      this.log.info({ dataset: ds, fork }, 'promoting fork before destroying its origin');
      await this.promoteOverQuota(newest.clone);
    }
  }

  /** `zfs promote` hands the origin's snapshots (and their space) to the fork, which its quota
   *  may not hold: the quota is lifted for the promote, then put back (or, when the fork now
   *  uses more, set to what it uses: it can write nothing more until it frees space). */
  private async promoteOverQuota(clone: string): Promise<void> {
    const quota = await this.prop(clone, 'quota');
    if (quota !== '0') await this.zfs(['set', 'quota=none', clone]);
    try {
      await this.zfs(['promote', clone]);
    } finally {
      if (quota !== '0') {
        const r = await this.zfs(['set', `quota=${quota}`, clone], true);
        if (r.exitCode !== 0) {
          const used = await this.prop(clone, 'used');
          this.log.warn({ dataset: clone, quota, used }, 'fork uses more than its quota after the promote; quota set to its use');
          await this.zfs(['set', `quota=${used}`, clone]);
        }
      }
    }
  }

  async listBoxRoots(): Promise<string[]> {
    const parent = `${this.root}/boxes`;
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'filesystem', '-r', '-d', '1', parent]);
    return lines(r.stdout)
      .filter((n) => n !== parent)
      .map((n) => n.slice(parent.length + 1));
  }

  // ---------------------------------------------------------------- box snapshots

  async snapshotBoxRoot(boxId: string, snapshot: string, description?: string): Promise<void> {
    checkUserSnapshot(snapshot);
    if (description !== undefined && /[\x00-\x1f\x7f]/.test(description)) throw new Error('a snapshot description is one line without control characters');
    const snap = `${this.boxDataset(boxId)}@${snapshot}`;
    const args = ['snapshot', ...(description ? ['-o', `${DESCRIPTION_PROP}=${description}`] : []), snap];
    const r = await this.zfs(args, true);
    if (r.exitCode === 0 || isExists(r.stderr)) return;
    if (isMissing(r.stderr)) throw new Error(`box root ${boxId} does not exist`);
    throw new CommandError([this.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  /**
   * What a rollback to `snapshot` would take from the box's other users: the user snapshots
   * taken after it (`zfs rollback` destroys them) and the boxes forked from the root after it
   * (their origins are internal snapshots after it). Both empty: the rollback loses nothing
   * but the root's changes since the snapshot.
   */
  async rollbackBlockers(boxId: string, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }> {
    checkUserSnapshot(snapshot);
    const ds = this.boxDataset(boxId);
    const all = await this.snapshotsOf(ds);
    const at = all.indexOf(`${ds}@${snapshot}`);
    if (at < 0) throw new Error(`box ${boxId} has no snapshot ${snapshot}`);
    const later = all.slice(at + 1);
    const clones = later.some((s) => snapName(s).startsWith(INTERNAL)) ? await this.snapshotClones(ds) : new Map<string, string[]>();
    return {
      snapshots: later.map(snapName).filter((n) => !n.startsWith(INTERNAL)),
      forks: later.flatMap((s) => clones.get(s) ?? []).map((c) => this.boxIdOf(c) ?? c),
    };
  }

  /**
   * Brings the root back to `snapshot` (its container stopped by the caller). Refused with
   * StorageInUseError, before anything changes, while later snapshots or forks depend on what
   * the rollback would destroy; internal snapshots no fork needs any more go with it.
   * Idempotent. A snapshot taken before the root was shifted into its id range marks the root
   * unshifted again, so its next start shifts it (`prepareBoxRoot`).
   */
  async rollbackBoxRoot(boxId: string, snapshot: string): Promise<void> {
    const ds = this.boxDataset(boxId);
    const snap = `${ds}@${snapshot}`;
    await serialized(this.pool, async () => {
      const blockers = await this.rollbackBlockers(boxId, snapshot);
      const dependents = [...blockers.snapshots.map((n) => `snapshot ${n}`), ...blockers.forks.map((b) => `fork ${b}`)];
      if (dependents.length > 0) throw new StorageInUseError(`box ${boxId} has ${dependents.join(', ')} after snapshot ${snapshot}`, dependents);
      await this.retryBusy(`zfs rollback ${snap}`, async () => {
        const r = await this.zfs(['rollback', '-r', snap], true);
        return r.exitCode === 0 ? null : r;
      });
      if ((await this.prop(snap, IDMAP_PROP)) === 'none') await this.zfs(['set', `${IDMAP_PROP}=none`, ds]);
    });
  }

  async destroyBoxSnapshot(boxId: string, snapshot: string): Promise<void> {
    checkUserSnapshot(snapshot);
    const snap = `${this.boxDataset(boxId)}@${snapshot}`;
    await serialized(this.pool, async () => {
      if (!(await this.exists(snap))) return;
      if ((await this.clonesOf(snap)).length > 0) {
        // Forks made from it still need its blocks: take the name away, keep the data until
        // the last fork goes (destroyBoxRoot drops unused internal origins).
        await this.hide(snap);
        return;
      }
      await this.destroySnapshot(snap);
    });
  }

  async listBoxSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    const ds = this.boxDataset(boxId);
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', '-d', '1', ds], true);
    if (r.exitCode !== 0) {
      if (isMissing(r.stderr)) throw new Error(`box root ${boxId} does not exist`);
      throw new CommandError([this.zfsBin, 'list', ds], r.exitCode, r.stdout, r.stderr);
    }
    const snaps = lines(r.stdout).filter((s) => s.startsWith(`${ds}@`) && !snapName(s).startsWith(INTERNAL));
    if (snaps.length === 0) return [];
    const props = await this.props(snaps, ['creation', 'used', DESCRIPTION_PROP], true);
    // `zfs list` answers snapshots in creation order (createtxg), finer than `creation` seconds.
    return snaps.map((s) => {
      const description = props.get(s)?.get(DESCRIPTION_PROP);
      return {
        name: snapName(s),
        createdAt: new Date(Number(props.get(s)?.get('creation') ?? 0) * 1000).toISOString(),
        sizeBytes: Number(props.get(s)?.get('used') ?? 0),
        ...(description !== undefined ? { description } : {}),
      };
    });
  }

  // ---------------------------------------------------------------- shared with data volumes

  /** The primitives data volumes are made of (workers/storage/zfsVolumes.ts), on this pool. */
  kit(): ZfsKit {
    return {
      root: this.root,
      mountRoot: () => this.mountRoot,
      zfsBin: this.zfsBin,
      zfs: (args, allowFailure) => this.zfs(args, allowFailure),
      exists: (name) => this.exists(name),
      prop: (name, property) => this.prop(name, property),
      props: (names, properties, setOnly) => this.props(names, properties, setOnly),
      ensureMounted: (ds) => this.ensureMounted(ds),
      mountPrivately: (dir) => this.mountPrivately(dir),
      snapshotsOf: (ds) => this.snapshotsOf(ds),
      destroySnapshot: (snap) => this.destroySnapshot(snap),
      destroyDataset: (ds) => this.destroyDataset(ds),
      retryBusy: (what, attempt) => this.retryBusy(what, attempt),
      serialized: (fn) => serialized(this.pool, fn),
    };
  }

  // ---------------------------------------------------------------- internals: naming

  private baseDataset(base: BaseRef): string {
    checkComponent('base name', base.name);
    checkComponent('base version', base.version);
    return `${this.root}/bases/${base.name}/${base.version}`;
  }

  private shiftedDataset(base: BaseRef, idMap: IdMap): string {
    return `${this.baseDataset(base).replace(`${this.root}/bases/`, `${this.root}/shifted/`)}/${idMap.hostId}`;
  }

  private boxDataset(boxId: string): string {
    checkComponent('box id', boxId);
    return `${this.root}/boxes/${boxId}`;
  }

  private boxIdOf(dataset: string): string | undefined {
    const prefix = `${this.root}/boxes/`;
    if (!dataset.startsWith(prefix)) return undefined;
    return dataset.slice(prefix.length).split('@')[0];
  }

  // ---------------------------------------------------------------- internals: daemon and pool

  private async ensureDaemon(): Promise<void> {
    const probe = await this.listPools();
    if (probe.exitCode === 0) return;
    if (!isDaemonDown(probe.stderr)) throw new Error(`zpool list failed: ${probe.stderr.trim()}`);
    if (!this.daemon.installed) throw new Error(`ZFS is not reachable (${probe.stderr.trim()}) and ${ZFS_FUSE} is not installed`);
    await this.daemon.start(async () => (await this.listPools()).exitCode === 0);
  }

  /** `zpool list`: whether any ZFS answers at all. */
  private async listPools(): Promise<RunResult> {
    try {
      return await this.zpool(['list', '-H', '-o', 'name'], true);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new Error('the zpool command is missing: run scripts/install-host.sh');
      throw e;
    }
  }

  /** ONLINE, DEGRADED, FAULTED, …, or null when the pool is not imported. */
  private async poolHealth(): Promise<string | null> {
    const r = await this.zpool(['list', '-H', '-o', 'health', this.pool], true);
    if (r.exitCode === 0) return r.stdout.trim();
    if (isMissing(r.stderr)) return null;
    throw new CommandError([this.zpoolBin, 'list', this.pool], r.exitCode, r.stdout, r.stderr);
  }

  private async ensureLoopPool(): Promise<void> {
    const health = await this.poolHealth();
    if (health !== null) {
      if (health !== 'ONLINE') this.log.warn({ pool: this.pool, health }, 'reusing a ZFS pool that is not ONLINE');
      return;
    }
    fs.mkdirSync(this.zfsDir, { recursive: true, mode: 0o700 });
    if (fs.existsSync(this.imagePath)) {
      // Known pool, not imported: exported, or the daemon lost it on a restart.
      let r = await this.zpool(['import', '-d', this.zfsDir, this.pool], true);
      if (r.exitCode !== 0 && /-f|in use|active/i.test(r.stderr)) {
        // The image lives in our own data dir, so "in use by another system" is our earlier self.
        r = await this.zpool(['import', '-f', '-d', this.zfsDir, this.pool], true);
      }
      if (r.exitCode === 0) {
        this.log.info({ pool: this.pool, image: this.imagePath }, 'imported the ZFS pool');
        return;
      }
      throw new Error(`${this.imagePath} exists but pool ${this.pool} cannot be imported from it: ${r.stderr.trim()}`);
    }
    // Sparse, so it always fits at first; it must be able to grow to its size, though.
    const size = Math.round(this.opts.poolSizeGb * 1024 ** 3);
    const host = await fs.promises.statfs(this.zfsDir);
    if (size > host.bavail * host.bsize) {
      throw new Error(
        `the pool file ${this.imagePath} would be ${bytes(size)} (BOXHOST_POOL_SIZE_GB), but its filesystem has only ${bytes(host.bavail * host.bsize)} free`,
      );
    }
    const fd = fs.openSync(this.imagePath, 'wx', 0o600);
    try {
      fs.ftruncateSync(fd, size);
    } finally {
      fs.closeSync(fd);
    }
    const r = await this.zpool(['create', '-m', this.defaultMount, this.pool, this.imagePath], true);
    if (r.exitCode !== 0) {
      // Killed at its deadline, the daemon may hold the pool already: its image stays (an import
      // finds it there after a restart).
      if (r.exitCode !== null) fs.rmSync(this.imagePath, { force: true });
      throw new Error(`zpool create ${this.pool} on ${this.imagePath} failed: ${r.stderr.trim() || 'no answer'}`);
    }
    this.log.info({ pool: this.pool, image: this.imagePath, sizeGb: this.opts.poolSizeGb }, 'created the ZFS pool');
  }

  private async ensureConfiguredPool(): Promise<void> {
    if ((await this.poolHealth()) !== null) return;
    await this.zpool(['import', this.pool], true);
    if ((await this.poolHealth()) === null) throw new Error(`ZFS pool ${this.pool} (BOXHOST_ZFS_POOL) is neither imported nor importable`);
  }

  private async ensureLayout(): Promise<void> {
    if (this.root !== this.pool && !(await this.exists(this.root))) {
      const parent = this.root.slice(0, this.root.lastIndexOf('/'));
      if (parent !== this.pool && !(await this.exists(parent))) await this.zfsTolerating(['create', '-p', parent], isExists);
      // Box roots live under the data dir as on the loop-file pool, so paths never depend on the pool.
      await this.zfsTolerating(['create', '-o', `mountpoint=${this.defaultMount}`, this.root], isExists);
    }
    for (const child of ['bases', 'shifted', 'boxes', 'data', 'tmp']) {
      const ds = `${this.root}/${child}`;
      if (!(await this.exists(ds))) await this.zfsTolerating(['create', ds], isExists);
    }
    // Inherited by every box root, data volume, base, shifted copy and temporary clone made under
    // them: none of them is ever a place to run a setuid file or open a device from on the host.
    for (const ds of ['boxes', 'data', 'bases', 'shifted', 'tmp']) for (const p of PRIVATE_MOUNT) await this.zfs(['set', p, `${this.root}/${ds}`]);
  }

  // ---------------------------------------------------------------- internals: datasets

  /**
   * Every `zfs` command goes through here, at most `concurrency` at once per pool in this
   * process (docs/decisions.md "Storage"): twenty creates or deletes at once otherwise queue
   * dozens of commands inside zfs-fuse, where the watchdog's `zpool list` and the health check
   * wait behind them and a busy daemon looks hung. Those looks use `zpool`, which is not gated.
   * A command holds its place only while it runs (never while waiting on another), so the gate
   * cannot deadlock.
   */
  private zfs(args: string[], allowFailure = false): Promise<RunResult> {
    return gateOf(this.pool, this.opts.concurrency ?? DEFAULT_ZFS_CONCURRENCY).run(() => this.timed([this.zfsBin, ...args], allowFailure));
  }

  private zpool(args: string[], allowFailure = false): Promise<RunResult> {
    return this.timed([this.zpoolBin, ...args], allowFailure);
  }

  /** A command killed at its deadline (no exit code) is remembered: `init` asks. */
  private async timed(argv: string[], allowFailure: boolean): Promise<RunResult> {
    try {
      const r = await run(argv, { allowFailure, timeoutMs: this.cmdTimeoutMs });
      if (r.exitCode === null) this.hungDaemon = this.daemon.pid();
      return r;
    } catch (e) {
      if (e instanceof CommandError && e.exitCode === null) this.hungDaemon = this.daemon.pid();
      throw e;
    }
  }

  /** Runs a mutation whose "already done" failure counts as success (concurrent or retried jobs). */
  private async zfsTolerating(args: string[], done: (stderr: string) => boolean): Promise<void> {
    const r = await this.zfs(args, true);
    if (r.exitCode !== 0 && !done(r.stderr)) throw new CommandError([this.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  private async exists(name: string): Promise<boolean> {
    const r = await this.zfs(['list', '-H', '-o', 'name', name], true);
    if (r.exitCode === 0) return true;
    if (isMissing(r.stderr)) return false;
    throw new CommandError([this.zfsBin, 'list', name], r.exitCode, r.stdout, r.stderr);
  }

  private async prop(name: string, property: string): Promise<string> {
    return (await this.zfs(['get', '-Hp', '-o', 'value', property, name])).stdout.trim();
  }

  /** Property values by dataset; with `setOnly`, a user property that is not set (source `-`)
   *  is left out rather than answered as `-`. */
  private async props(names: string[], properties: string[], setOnly = false): Promise<Map<string, Map<string, string>>> {
    const r = await this.zfs(['get', '-Hp', '-o', 'name,property,value,source', properties.join(','), ...names]);
    const out = new Map<string, Map<string, string>>();
    for (const line of lines(r.stdout)) {
      const [name, property, value, source] = line.split('\t');
      if (!out.has(name)) out.set(name, new Map());
      if (setOnly && property.includes(':') && source === '-') continue;
      out.get(name)!.set(property, value);
    }
    return out;
  }

  /** Mounts `ds` unless it is mounted. Concurrent retries of one create race here: while one
   *  `zfs mount` runs, another answers "mountpoint or dataset is busy", so a busy answer waits
   *  and looks again rather than failing a create whose root is in fact being mounted. */
  private async ensureMounted(ds: string): Promise<void> {
    // A mount racing another of the same dataset (another process's create) fails with "directory
    // is not empty" or "failed to create mountpoint" until that one is done: tried again, and
    // `mounted` looked at first each time.
    await this.retryBusy(
      `zfs mount ${ds}`,
      async () => {
        if ((await this.prop(ds, 'mounted')) === 'yes') return null;
        const r = await this.zfs(['mount', ds], true);
        return r.exitCode === 0 || /already mounted/i.test(r.stderr) ? null : r;
      },
      (stderr) => /directory is not empty|failed to create mountpoint/i.test(stderr),
    );
  }

  /** Snapshots of one dataset, oldest first. */
  private async snapshotsOf(ds: string): Promise<string[]> {
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', '-d', '1', ds]);
    return lines(r.stdout).filter((s) => s.startsWith(`${ds}@`));
  }

  /** origin snapshot → the filesystems cloned from it, for every snapshot of `ds`.
   *  zfs-fuse has no `clones` property, so the pool's origins are read instead. */
  private async snapshotClones(ds: string): Promise<Map<string, string[]>> {
    const r = await this.zfs(['list', '-H', '-o', 'name,origin', '-t', 'filesystem', '-r', this.pool]);
    const out = new Map<string, string[]>();
    for (const line of lines(r.stdout)) {
      const [name, origin] = line.split('\t');
      if (!origin?.startsWith(`${ds}@`)) continue;
      if (!out.has(origin)) out.set(origin, []);
      out.get(origin)!.push(name);
    }
    return out;
  }

  /** Every filesystem whose chain of origins leads back to `ds`: forks of forks count too,
   *  although only the first generation is a clone of `ds` itself. */
  private async descendantsOf(ds: string): Promise<string[]> {
    const r = await this.zfs(['list', '-H', '-o', 'name,origin', '-t', 'filesystem', '-r', this.pool]);
    const parent = new Map<string, string>();
    for (const line of lines(r.stdout)) {
      const [name, origin] = line.split('\t');
      if (origin && origin !== '-') parent.set(name, origin.split('@')[0]);
    }
    return [...parent.keys()].filter((name) => {
      const seen = new Set<string>();
      for (let at = parent.get(name); at !== undefined && !seen.has(at); at = parent.get(at)) {
        if (at === ds) return true;
        seen.add(at);
      }
      return false;
    });
  }

  private async clonesOf(snap: string): Promise<string[]> {
    return (await this.snapshotClones(snap.split('@')[0])).get(snap) ?? [];
  }

  /** Renames a snapshot to a unique internal name: it leaves listings and frees its name. */
  private async hide(snap: string): Promise<string> {
    const [ds, name] = snap.split('@');
    const hidden = `${ds}@${INTERNAL}${name.replace(/^_+/, '')}.${crypto.randomBytes(4).toString('hex')}`;
    const r = await this.zfs(['rename', snap, hidden], true);
    // zfs-fuse renames, then tries to remount the snapshot's clones, which fails for a clone in
    // use (a running fork's root: "cannot mount …: dataset is busy"). The clone was never
    // unmounted; the rename is done.
    if (r.exitCode !== 0 && !((await this.exists(hidden)) && !(await this.exists(snap)))) {
      throw new CommandError([this.zfsBin, 'rename', snap, hidden], r.exitCode, r.stdout, r.stderr);
    }
    return hidden;
  }

  /** Destroys an internal box snapshot once no clone needs it; user snapshots and bases stay. */
  private async dropIfUnused(snap: string): Promise<void> {
    if (!this.boxIdOf(snap) || !snapName(snap).startsWith(INTERNAL)) return;
    if (!(await this.exists(snap))) return;
    if ((await this.clonesOf(snap)).length > 0) return;
    await this.destroySnapshot(snap);
  }

  private async dropForkSnapshots(boxId: string): Promise<void> {
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', `${this.root}/boxes`]);
    for (const snap of lines(r.stdout)) {
      if (snapName(snap) === `${INTERNAL}fork-${boxId}`) await this.dropIfUnused(snap);
    }
  }

  private async destroySnapshot(snap: string): Promise<void> {
    await this.retryBusy(`zfs destroy ${snap}`, async () => {
      const r = await this.zfs(['destroy', snap], true);
      return r.exitCode === 0 || isMissing(r.stderr) ? null : r;
    });
  }

  /** Destroys a filesystem and its snapshots. zfs-fuse reports "dataset is busy" for a dataset
   *  that was just used, even with -f: unmount first, then retry with a short pause. */
  private async destroyDataset(ds: string, recursive = true): Promise<void> {
    const args = recursive ? ['destroy', '-r', ds] : ['destroy', ds];
    let attempt = 0;
    await this.retryBusy(`zfs ${args.join(' ')}`, async () => {
      const force = attempt++ >= BUSY_TRIES / 2;
      await this.zfs(force ? ['umount', '-f', ds] : ['umount', ds], true);
      const r = await this.zfs(args, true);
      return r.exitCode === 0 || isMissing(r.stderr) ? null : r;
    });
  }

  /** Calls `attempt` until it answers null (done); retries only "busy" failures. */
  private async retryBusy(what: string, attempt: () => Promise<RunResult | null>, alsoTransient: (stderr: string) => boolean = () => false): Promise<void> {
    for (let i = 1; ; i++) {
      const r = await attempt();
      if (r === null) return;
      if (!(isBusy(r.stderr) || alsoTransient(r.stderr)) || i >= BUSY_TRIES) throw new Error(`${what} failed: ${r.stderr.trim() || r.stdout.trim()}`);
      await sleep(Math.min(25 * 2 ** (i - 1), 1000));
    }
  }
}

// ------------------------------------------------------------------ helpers

export function lines(s: string): string[] {
  return s.split('\n').filter((l) => l.length > 0);
}

export function snapName(snap: string): string {
  return snap.slice(snap.indexOf('@') + 1);
}

function bytes(n: number): string {
  return n >= 1024 ** 3 ? `${(n / 1024 ** 3).toFixed(1)} GiB` : `${Math.round(n / 1024 ** 2)} MiB`;
}

export function quotaArg(gb: number): string {
  return Number.isInteger(gb) ? `${gb}G` : String(Math.round(gb * 1024 ** 3));
}

const locks = new Map<string, Promise<unknown>>();

/** Runs `fn` after every earlier call with the same key in this process has finished. */
/** At most `limit` calls of `run` at once; the rest start in the order they came. */
export class Gate {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(readonly limit: number) {}

  /** Calls running and waiting now. */
  get load(): { active: number; waiting: number } {
    return { active: this.active, waiting: this.waiting.length };
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve));
    else this.active++;
    try {
      return await fn();
    } finally {
      // The place passes straight to the next in line (active stays counted), or is freed.
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }
}

const DEFAULT_ZFS_CONCURRENCY = 4;
const gates = new Map<string, Gate>();
/** One gate per pool in the process: several drivers of one pool (a test's, a node's) share it. */
function gateOf(pool: string, limit: number): Gate {
  let g = gates.get(pool);
  if (!g) gates.set(pool, (g = new Gate(limit)));
  return g;
}

function serialized<T>(key: string, fn: () => Promise<T>): Promise<T> {
  const next = (locks.get(key) ?? Promise.resolve()).then(fn, fn);
  const settled = next.catch(noop);
  locks.set(key, settled);
  void settled.then(() => {
    if (locks.get(key) === settled) locks.delete(key);
  });
  return next;
}
