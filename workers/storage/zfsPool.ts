/**
 * The pool under the ZFS storage: the zfs-fuse daemon (started when no ZFS answers), the pool
 * (a sparse file in the data dir, or a configured one), its layout and mount, health, the
 * watchdog's probe, a restart after a hang, and what it can hold.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { CommandError, run, sleep, type RunResult } from '../../core/command';
import { settleWithin } from '../../core/timeout';
import type { DriverLogger, StorageProbe } from '../drivers';
import { fuseMountsOf, mountedUnder, removeEmptyDirs } from './hostFs';
import { bytes, CMD_TIMEOUT_MS, isExists, isMissing, PRIVATE_MOUNT, ROOT_MOUNT_RESERVE, serialized } from './zfsCommon';
import type { ZfsDatasets } from './zfsDatasets';
import { ownDir } from '../hostDirs';
import { isDaemonDown, ROOTS_PER_ARC_MB, ZFS_FUSE, ZFS_FUSE_MAX_MOUNTS, ZfsFuseDaemon, zfsFuseMounts, zfsFuseServes } from './zfsFuse';

/** The pool's directories no box's range enters (`closeHostOnly`). */
export const HOST_ONLY = ['data', 'bases', 'shifted', 'tmp'] as const;

export interface ZfsPoolOptions {
  /** `<data dir>/zfs`: the pool file, its default mount and the pool lock live here. */
  zfsDir: string;
  /** The loop-file pool this driver makes and may destroy (else a configured one). */
  ownsPool: boolean;
  poolSizeGb: number;
  startHangMs?: number;
  log: DriverLogger;
  /** Called after a restart: what was known made may have to be looked at again. */
  onRestart: () => void;
}

export class ZfsPool {
  readonly imagePath: string;
  readonly defaultMount: string;
  /** The probe's lookup in the boxes directory while it runs (`probe`). */
  private lookup?: Promise<RunResult>;

  constructor(
    private readonly d: ZfsDatasets,
    readonly daemon: ZfsFuseDaemon,
    private readonly opts: ZfsPoolOptions,
  ) {
    this.imagePath = path.join(opts.zfsDir, 'pool.img');
    this.defaultMount = path.join(opts.zfsDir, 'mnt');
  }

  private get pool(): string {
    return this.d.pool;
  }

  private get root(): string {
    return this.d.root;
  }

  private get zfsDir(): string {
    return this.opts.zfsDir;
  }

  private get ownsPool(): boolean {
    return this.opts.ownsPool;
  }

  /**
   * Daemon, pool, layout. A zfs-fuse that gives no answer meanwhile (it has hung on its first
   * `zfs create` after a long life: CI, 2026-11-24) is killed, started anew and the start tried
   * once more: a node that cannot start has no watchdog yet to do it (startHangMs).
   */
  async init(): Promise<void> {
    const hangMs = this.opts.startHangMs;
    if (!hangMs || !this.restartable) return this.initOnce();
    this.d.cmdTimeoutMs = hangMs;
    this.d.hungDaemon = undefined;
    try {
      return await this.initOnce();
    } catch (e) {
      if (this.d.hungDaemon === undefined) throw e;
      this.d.log.warn({ err: (e as Error).message, hangMs }, `ZFS gave no answer within ${hangMs / 1000} s while the node started: restarting zfs-fuse`);
    } finally {
      this.d.cmdTimeoutMs = CMD_TIMEOUT_MS;
    }
    const hung = this.d.hungDaemon;
    // Kill, start, import and mount as one step beside the other nodes' restarts in this process.
    await serialized('zfs-fuse restart', () => this.restartOnce(hung));
    await this.initOnce();
  }

  private async initOnce(): Promise<void> {
    await this.ensureDaemon();
    if (this.restartable) {
      const arcMb = this.daemon.runningArcMb();
      if (arcMb * ROOTS_PER_ARC_MB < ZFS_FUSE_MAX_MOUNTS) {
        this.d.log.warn(
          { arcMb, roots: Math.floor(arcMb * ROOTS_PER_ARC_MB) },
          `the running zfs-fuse has an ARC of ${arcMb} MB, which holds about ${Math.floor(arcMb * ROOTS_PER_ARC_MB)} mounted filesystems: this node takes fewer boxes until zfs-fuse runs with max-arc-size ${Math.ceil(ZFS_FUSE_MAX_MOUNTS / ROOTS_PER_ARC_MB)} or more (/etc/zfs/zfsrc, or stop it and let boxhost start it)`,
        );
      }
    }
    if (this.ownsPool) await this.ensureLoopPool();
    else await this.ensureConfiguredPool();
    await this.ensureLayout();
    const mp = await this.d.prop(this.root, 'mountpoint');
    if (!path.isAbsolute(mp)) throw new Error(`dataset ${this.root} has mountpoint ${mp}; boxhost needs a mounted directory`);
    // Resolved: the mount table, and runc (which takes no symlink on a root's path), name
    // mounts by their real path; a data dir reached through a symlink must not change that.
    this.d.setMountRoot(await fs.promises.realpath(mp).catch(() => mp));
  }

  async health(): Promise<void> {
    const health = await this.poolHealth();
    if (health === null) throw new Error(`ZFS pool ${this.pool} is not imported`);
    if (health === 'DEGRADED') this.d.log.warn({ pool: this.pool }, 'ZFS pool is DEGRADED');
    else if (health !== 'ONLINE') throw new Error(`ZFS pool ${this.pool} is ${health}`);
    // Not through the gate: a health check that waited behind twenty creates' commands would
    // report a busy node's storage as failing.
    const mounted = await run([this.d.zfsBin, 'get', '-Hp', '-o', 'value', 'mounted', this.root], { timeoutMs: CMD_TIMEOUT_MS });
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
    return zfsFuseServes();
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
    this.lookup ??= run(['stat', '-c', '%i', path.join(this.d.mountRoot(), 'boxes', name)], { allowFailure: true })
      .catch((e: Error) => ({ exitCode: -1, stdout: '', stderr: e.message }))
      .finally(() => (this.lookup = undefined));
    const [pool, fsys, lookup] = await Promise.all([
      bounded([this.d.zpoolBin, 'list', '-H', '-o', 'health', this.pool]),
      bounded(['stat', '-f', '-c', '%b', this.d.mountRoot()]),
      settleWithin(this.lookup, timeoutMs + 500, { exitCode: -2, stdout: '', stderr: 'no answer' }),
    ]);
    if (pool.exitCode !== 0 && isDaemonDown(pool.stderr)) return { state: 'dead', detail: `ZFS does not answer: ${pool.stderr.trim()}` };
    if (pool.exitCode !== 0 && isMissing(pool.stderr)) return { state: 'dead', detail: `pool ${this.pool} is not imported` };
    if (/not connected/i.test(fsys.stderr) || /not connected/i.test(lookup.stderr)) return { state: 'dead', detail: `${this.d.mountRoot()}: transport endpoint is not connected` };
    if ((pool.exitCode !== 0 || fsys.exitCode !== 0) && (late() || pool.exitCode === -2 || fsys.exitCode === -2)) {
      const daemon = pool.exitCode !== 0;
      return { state: 'hung', scope: daemon ? 'daemon' : 'only-mounts', detail: `no answer within ${timeoutMs} ms (${daemon ? 'zpool list' : 'statfs of the pool root'})` };
    }
    if (lookup.exitCode === -2) return { state: 'hung', scope: 'only-mounts', detail: `no answer within ${timeoutMs} ms (a lookup in ${this.d.mountRoot()}/boxes)` };
    if (pool.exitCode !== 0) return { state: 'error', detail: `zpool list: ${pool.stderr.trim()}` };
    if (fsys.exitCode !== 0) return { state: 'error', detail: `statfs ${this.d.mountRoot()}: ${fsys.stderr.trim()}` };
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
    await this.d.zfs(['mount', '-a'], true);
    this.opts.onRestart();
  }

  /** Detaches (lazily: a box may hold one open) this pool's mounts of a dead daemon. */
  private async detachMounts(): Promise<void> {
    for (const point of fuseMountsOf(this.pool)) {
      const r = await run(['umount', '-l', point], { allowFailure: true, timeoutMs: 30_000 });
      if (r.exitCode !== 0 && !/not mounted|no mount point/i.test(r.stderr)) this.d.log.warn({ point, err: r.stderr.trim() }, 'could not detach a mount of the dead daemon');
    }
  }

  /** What the pool can hold for boxhost: used + available of its root dataset. */
  async capacityBytes(): Promise<number> {
    const p = (await this.d.props([this.root], ['used', 'available'])).get(this.root);
    return Number(p?.get('used') ?? 0) + Number(p?.get('available') ?? 0);
  }

  /** Destroys the loop-file pool this driver made and removes its image (tests, cleanup).
   *  Refuses a configured pool. */
  async destroyPool(): Promise<void> {
    if (!this.ownsPool) throw new Error(`refusing to destroy configured pool ${this.pool}`);
    if ((await this.poolHealth()) !== null) {
      await this.d.retryBusy(`zpool destroy ${this.pool}`, async () => {
        const r = await this.d.zpool(['destroy', '-f', this.pool], true);
        if (r.exitCode !== 0 && !isMissing(r.stderr)) return r;
        return null;
      });
    }
    fs.rmSync(this.imagePath, { force: true });
    fs.rmSync(this.d.lock.file, { force: true });
    // Only empty directories go: a mount left behind must never be recursed into.
    if (!mountedUnder(this.zfsDir)) removeEmptyDirs(this.zfsDir);
  }

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
      return await this.d.zpool(['list', '-H', '-o', 'name'], true);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new Error('the zpool command is missing: run scripts/install-host.sh');
      throw e;
    }
  }

  /** ONLINE, DEGRADED, FAULTED, …, or null when the pool is not imported. */
  private async poolHealth(): Promise<string | null> {
    const r = await this.d.zpool(['list', '-H', '-o', 'health', this.pool], true);
    if (r.exitCode === 0) return r.stdout.trim();
    if (isMissing(r.stderr)) return null;
    throw new CommandError([this.d.zpoolBin, 'list', this.pool], r.exitCode, r.stdout, r.stderr);
  }

  private async ensureLoopPool(): Promise<void> {
    const health = await this.poolHealth();
    if (health !== null) {
      if (health !== 'ONLINE') this.d.log.warn({ pool: this.pool, health }, 'reusing a ZFS pool that is not ONLINE');
      return;
    }
    fs.mkdirSync(this.zfsDir, { recursive: true, mode: 0o700 });
    if (fs.existsSync(this.imagePath)) {
      // Known pool, not imported: exported, or the daemon lost it on a restart.
      let r = await this.d.zpool(['import', '-d', this.zfsDir, this.pool], true);
      if (r.exitCode !== 0 && /-f|in use|active/i.test(r.stderr)) {
        // The image lives in our own data dir, so "in use by another system" is our earlier self.
        r = await this.d.zpool(['import', '-f', '-d', this.zfsDir, this.pool], true);
      }
      if (r.exitCode === 0) {
        this.d.log.info({ pool: this.pool, image: this.imagePath }, 'imported the ZFS pool');
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
    const r = await this.d.zpool(['create', '-m', this.defaultMount, this.pool, this.imagePath], true).catch((e: unknown) => {
      // Never started (it could not be spawned): no pool uses the image. (With allowFailure a
      // command that ran, or whose mount lock was not free in time, answers: handled below.)
      fs.rmSync(this.imagePath, { force: true });
      throw e;
    });
    // (A health that cannot be read counts as unknown: the create's own error is the one told.)
    const healthNow = async () => this.poolHealth().catch(() => undefined);
    // Made, but its mount failed: zfs-fuse has answered a FUSE mount with "Input/output error"
    // now and then under load (a CI run's node failed to start so). Mounted again, a few times.
    const mountedAgain = r.exitCode !== 0 && /cannot mount/i.test(r.stderr) && (await healthNow()) === 'ONLINE' && (await this.mountNewPool());
    if (mountedAgain) this.d.log.warn({ pool: this.pool, err: r.stderr.trim() }, 'the new ZFS pool was mounted on a second try');
    else if (r.exitCode !== 0) {
      // Killed at its deadline, the daemon may hold the pool already: its image stays (an import
      // finds it there after a restart). Made but never mounted: destroyed first, so the daemon
      // holds no pool on a removed file (the next start's create would find the pool there).
      if (r.exitCode !== null) {
        if (await healthNow()) await this.d.zpool(['destroy', '-f', this.pool], true);
        if ((await healthNow()) === null) fs.rmSync(this.imagePath, { force: true });
      }
      throw new Error(`zpool create ${this.pool} on ${this.imagePath} failed: ${r.stderr.trim() || 'no answer'}`);
    }
    this.d.log.info({ pool: this.pool, image: this.imagePath, sizeGb: this.opts.poolSizeGb }, 'created the ZFS pool');
  }

  /** Mounts a pool whose create could not (up to 5 tries, a little apart); true once mounted. */
  private async mountNewPool(): Promise<boolean> {
    for (let i = 0; i < 5; i++) {
      await sleep(200 * (i + 1));
      if ((await this.d.zfs(['mount', this.pool], true)).exitCode === 0) return true;
      if ((await this.d.zfs(['get', '-H', '-o', 'value', 'mounted', this.pool], true)).stdout.trim() === 'yes') return true;
    }
    return false;
  }

  private async ensureConfiguredPool(): Promise<void> {
    if ((await this.poolHealth()) !== null) return;
    await this.d.zpool(['import', this.pool], true);
    if ((await this.poolHealth()) === null) throw new Error(`ZFS pool ${this.pool} (BOXHOST_ZFS_POOL) is neither imported nor importable`);
  }

  private async ensureLayout(): Promise<void> {
    if (this.root !== this.pool && !(await this.d.exists(this.root))) {
      const parent = this.root.slice(0, this.root.lastIndexOf('/'));
      if (parent !== this.pool && !(await this.d.exists(parent))) await this.d.zfsTolerating(['create', '-p', parent], isExists);
      // Box roots live under the data dir as on the loop-file pool, so paths never depend on the pool.
      await this.d.zfsTolerating(['create', '-o', `mountpoint=${this.defaultMount}`, this.root], isExists);
    }
    for (const child of ['bases', 'shifted', 'boxes', 'data', 'tmp']) {
      const ds = `${this.root}/${child}`;
      if (!(await this.d.exists(ds))) await this.d.zfsTolerating(['create', ds], isExists);
    }
    // Inherited by every box root, data volume, base, shifted copy and temporary clone made under
    // them: none of them is ever a place to run a setuid file or open a device from on the host.
    for (const ds of ['boxes', 'data', 'bases', 'shifted', 'tmp']) for (const p of PRIVATE_MOUNT) await this.d.zfs(['set', p, `${this.root}/${ds}`]);
    await this.closeHostOnly();
  }

  /**
   * The directories of data volumes, bases, shifted bases and temporary clones are the host
   * root's alone (`root:root` 0700, set at every start whatever made them otherwise): no box's
   * range ever walks through them. runc opens a bind mount's source as the host's root before
   * the container's user namespace takes over, so a box still gets its volumes; a process that
   * escapes a box lands as its range's user and reaches none of them (docs/security.md
   * "Escapes"). Box roots are behind their own range's directory instead
   * (workers/storage/rangeDirs.ts): runc's init walks to a root as the range's user.
   */
  private async closeHostOnly(): Promise<void> {
    for (const child of HOST_ONLY) {
      const ds = `${this.root}/${child}`;
      // Mounted if it can be; one that cannot (a directory left under it) is said, not fatal:
      // what is under it is not mounted through it either.
      await this.d.ensureMounted(ds).catch((e: Error) => this.d.log.warn({ dataset: ds, err: e.message }, `could not mount ${ds} to close its directory`));
      const [dir, mounted] = await Promise.all([this.d.prop(ds, 'mountpoint'), this.d.prop(ds, 'mounted')]);
      if (!path.isAbsolute(dir) || mounted !== 'yes') continue; // legacy/none: nothing to close
      await ownDir(dir, 0, 0, 0o700);
    }
  }
}
