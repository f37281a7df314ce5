/**
 * Box roots on the ZFS storage: `R/boxes/<boxId>`, a clone of a base's copy in the project's id
 * range or of another root's snapshot (a fork), readied for a start (shifted into the range if
 * made before user namespaces, mounted nosuid,nodev), and destroyed with its forks promoted
 * off it first (under the pool lock, workers/storage/poolLock.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import { CommandError, type RunResult } from '../../core/command';
import { allSettledOrThrow } from '../../core/promises';
import { shiftTree } from '../bases/idShift';
import type { IdMap, RootSource } from '../drivers';
import { BASE_SNAPSHOT, checkComponent, checkUserSnapshot, IDMAP_PROP, INTERNAL, isExists, isMissing, lines, noop, quotaArg, snapName } from './zfsCommon';
import type { ZfsBases } from './zfsBases';
import type { ZfsDatasets } from './zfsDatasets';
import { RangeDirs } from './rangeDirs';

/** How long a root cloned by this process counts as fresh for its first start (a create's start
 *  follows its clone within milliseconds; one much later looks again). */
const FRESH_ROOT_MS = 30_000;

export class ZfsRoots {
  /** The create of each box root under way in this process (createBoxRoot: attempts take turns). */
  private readonly creatingRoots = new Map<string, Promise<string>>();
  /** Each range's roots behind a directory only it enters (workers/storage/rangeDirs.ts). */
  private readonly ranges: RangeDirs;
  /** Roots this process has just cloned from files in their range, mounted behind it: the
   *  range's id, the mount and when, until the first `prepareBoxRoot` (the create's start) takes it. */
  private readonly fresh = new Map<string, { hostId: number; mount: string; at: number; daemon: number | null }>();

  constructor(
    private readonly d: ZfsDatasets,
    private readonly bases: ZfsBases,
  ) {
    this.ranges = new RangeDirs(() => this.d.mountRoot());
  }

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
    const ds = this.d.boxDataset(boxId);
    if (storageGb !== undefined && !(Number.isFinite(storageGb) && storageGb > 0)) throw new Error(`invalid storage size ${storageGb} GB`);

    // What went wrong is read from the clone's failure.
    let origin: string;
    let missing: string;
    let madeForkSnapshot = false;
    let inRange: string | null = null;
    if (source.kind === 'base') {
      missing = `base ${source.base.name}@${source.base.version} does not exist`;
      if (idMap) {
        origin = `${await this.bases.shiftedBase(source.base, idMap, missing)}@${BASE_SNAPSHOT}`;
        inRange = String(idMap.hostId);
      } else {
        origin = `${this.d.baseDataset(source.base)}@${BASE_SNAPSHOT}`;
      }
    } else {
      // Checked first: on a retry the source may be gone already (destroyed, fork promoted).
      if (await this.d.exists(ds)) {
        await this.d.ensureMounted(ds);
        await this.relink(boxId); // an earlier attempt may have died between its clone and the link
        return this.boxRootPath(boxId);
      }
      const src = this.d.boxDataset(source.boxId);
      // The range of the files cloned: a new snapshot's is its root's (read side by side).
      let range: Promise<RunResult>;
      if (source.snapshot !== undefined) {
        checkUserSnapshot(source.snapshot);
        origin = `${src}@${source.snapshot}`;
        missing = `box ${source.boxId} has no snapshot ${source.snapshot}`;
        range = this.d.zfs(['get', '-Hp', '-o', 'value', IDMAP_PROP, origin], true);
      } else {
        // Named after the new box so that a retried fork reuses its first snapshot.
        origin = `${src}@${INTERNAL}fork-${boxId}`;
        missing = `box root ${source.boxId} does not exist`;
        range = this.d.zfs(['get', '-Hp', '-o', 'value', IDMAP_PROP, src], true);
        const r = await this.d.zfs(['snapshot', origin], true);
        if (r.exitCode === 0) madeForkSnapshot = true;
        else if (isMissing(r.stderr)) throw new Error(missing);
        else if (!isExists(r.stderr)) throw new CommandError([this.d.zfsBin, 'snapshot', origin], r.exitCode, r.stdout, r.stderr);
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
    // Mounted behind its range's directory, made first so that it is never open to others. Its
    // directories are checked at every create; once this process has found them right, the
    // check (≈1–3 ms of lookups on the pool's FUSE mount) goes on beside the clone rather than
    // before it (docs/security.md "Escapes").
    let mountAt: string | undefined;
    let rangeReady: Promise<unknown> = Promise.resolve();
    if (idMap) {
      mountAt = this.ranges.rootMount(boxId, idMap);
      const known = this.ranges.known(idMap);
      rangeReady = this.ranges.ensure(idMap);
      if (!known) await rangeReady;
      args.push('-o', `mountpoint=${mountAt}`);
    }
    args.push(origin, ds);
    // The daemon that mounts the clone: read before it, so that a restart from here on (which
    // mounts it anew, without nosuid,nodev) shows as another pid at the create's start.
    const daemon = this.d.daemonPid();
    const [r] = await allSettledOrThrow([this.d.zfs(args, true), rangeReady] as const);
    // "already exists": an earlier attempt made it (an existing root is kept as it is);
    // "successfully created, but not mounted": the clone is there, only the mount failed;
    // "cannot mount …" with the clone there: the clone was made and its mount met another's (an
    // attempt in another process, or one this process started before: zfs-fuse then answers
    // "busy", "directory is not empty" or "failed to create mountpoint"); mounted again below.
    const raced = r.exitCode !== 0 && /cannot mount/i.test(r.stderr) && (await this.d.exists(ds));
    if (r.exitCode === 0 || isExists(r.stderr) || /successfully created/i.test(r.stderr) || raced) {
      if (r.exitCode !== 0) await this.d.ensureMounted(ds);
      // The old path names the root still (a root that existed already may be of the old layout:
      // moved at its start). Made nosuid,nodev now, beside the box's namespaces, rather than on
      // its start's path; the link is made meanwhile.
      const [linked] = await allSettledOrThrow([mountAt ? this.ranges.link(this.boxRootPath(boxId), mountAt) : Promise.resolve(false), mountAt ? this.d.mountPrivately(mountAt) : Promise.resolve()] as const);
      const real = mountAt && linked ? mountAt : this.boxRootPath(boxId);
      if (real !== mountAt) await this.d.mountPrivately(real);
      // Cloned just now from files in its range (a base's copy, or a fork of a root or snapshot
      // marked so; one marked `none` is shifted at its first start), behind its range.
      if (r.exitCode === 0 && idMap && inRange === String(idMap.hostId) && real === mountAt) this.fresh.set(boxId, { hostId: idMap.hostId, mount: real, at: Date.now(), daemon });
      return this.boxRootPath(boxId);
    }
    if (madeForkSnapshot) await this.dropIfUnused(origin).catch(noop);
    if (isMissing(r.stderr)) throw new Error(missing);
    throw new CommandError([this.d.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  async prepareBoxRoot(boxId: string, idMap: IdMap): Promise<string> {
    // The create's own start, moments after the clone: its files, its place and its mount's
    // flags need no second look (≈5 ms of FUSE lookups and a request to the node's helper on a
    // create's path), unless the storage daemon is another one since (a restart mounts every
    // dataset anew, without nosuid,nodev). Once only.
    const fresh = this.fresh.get(boxId);
    this.fresh.delete(boxId);
    if (fresh && fresh.hostId === idMap.hostId && Date.now() - fresh.at < FRESH_ROOT_MS) {
      if (fresh.daemon !== this.d.daemonPid()) await this.d.mountPrivately(fresh.mount);
      return fresh.mount;
    }
    const dir = this.boxRootPath(boxId);
    // A mounted root whose top directory the range's root owns was made in the range: no ZFS
    // command needed (the property decides only when this says otherwise).
    const st = await fs.promises.stat(dir).catch(() => null);
    if (st?.uid !== idMap.hostId) await this.shiftIntoRange(boxId, idMap);
    const pl = await this.placeBehindRange(boxId, idMap);
    await this.d.mountPrivately(pl);
    return pl;
  }

  /**
   * The real mount of a root, behind its range's directory: a root of the old layout (mounted at
   * `<mount root>/boxes/<id>`, open to every host user) is moved there first (its mountpoint
   * set, which remounts it: the box is not running). A move that fails (the mount busy) leaves
   * the root where it was, to be moved at a later start.
   */
  private async placeBehindRange(boxId: string, idMap: IdMap): Promise<string> {
    const link = this.boxRootPath(boxId);
    const ds = this.d.boxDataset(boxId);
    const target = this.ranges.rootMount(boxId, idMap);
    // Its range's directories as they must be, at every start (a umask, an operator's chmod).
    const [st] = await Promise.all([fs.promises.lstat(link).catch(() => null), this.ranges.ensure(idMap)]);
    if (st?.isSymbolicLink()) return fs.promises.realpath(link);
    if (!st) return this.relink(boxId); // a run that died between the clone (or a move) and the link
    if (!st.isDirectory()) return link;
    const r = await this.d.zfs(['set', `mountpoint=${target}`, ds], true);
    // The property may be set with the remount failed (busy): it is mounted where it says.
    await this.d.ensureMounted(ds);
    if (r.exitCode !== 0 && (await this.d.prop(ds, 'mountpoint')) !== target) {
      this.d.log.warn({ boxId, err: r.stderr.trim() }, 'could not move a box root behind its id range; it stays open to other host users until a later start');
      return link;
    }
    if (!(await this.ranges.link(link, target))) return link;
    this.d.log.info({ boxId, hostId: idMap.hostId }, 'moved a box root behind its id range');
    return target;
  }

  /** Links a root's old path to where its dataset says it is mounted (when that is elsewhere);
   *  answers the real mount, or the old path when the root is there. */
  private async relink(boxId: string): Promise<string> {
    const link = this.boxRootPath(boxId);
    const mountpoint = await this.d.prop(this.d.boxDataset(boxId), 'mountpoint');
    return mountpoint !== link && (await this.ranges.link(link, mountpoint)) ? mountpoint : link;
  }

  private async shiftIntoRange(boxId: string, idMap: IdMap): Promise<void> {
    const ds = this.d.boxDataset(boxId);
    if (!(await this.d.exists(ds))) throw new Error(`box root ${boxId} does not exist`);
    await this.d.ensureMounted(ds);
    const range = await this.d.prop(ds, IDMAP_PROP);
    if (range === String(idMap.hostId)) return;
    if (/^\d+$/.test(range)) throw new Error(`box root ${boxId} is in the id range from ${range}, not ${idMap.hostId}`);
    // Made before user namespaces: its files (and what its snapshots hold, which stays as it
    // was: they are marked `none`, so a fork of one is shifted in turn) move into the range.
    const dir = await fs.promises.realpath(this.boxRootPath(boxId));
    const t0 = Date.now();
    const snapshots = await this.d.snapshotsOf(ds);
    if (snapshots.length > 0) await this.d.zfs(['set', `${IDMAP_PROP}=none`, ...snapshots]);
    const { entries } = await shiftTree(dir, idMap);
    await this.d.zfs(['set', `${IDMAP_PROP}=${idMap.hostId}`, ds]);
    // Box roots of that version had only a refquota; snapshots now count as well.
    const refquota = await this.d.prop(ds, 'refquota');
    if (refquota !== '0' && (await this.d.prop(ds, 'quota')) === '0') await this.d.zfs(['set', `quota=${refquota}`, ds]);
    this.d.log.info({ boxId, hostId: idMap.hostId, entries, ms: Date.now() - t0 }, 'shifted a box root made before user namespaces into its id range');
  }

  boxRootPath(boxId: string): string {
    checkComponent('box id', boxId);
    return path.join(this.d.mountRoot(), 'boxes', boxId);
  }

  boxRootMount(boxId: string, idMap: IdMap): string {
    return this.ranges.rootMount(boxId, idMap);
  }

  async hasBoxRoot(boxId: string): Promise<boolean> {
    return this.d.exists(this.d.boxDataset(boxId));
  }

  /** After a restart of the daemon: every root was mounted again, so none counts as fresh. */
  forget(): void {
    this.fresh.clear();
    this.ranges.forget();
  }

  async destroyBoxRoot(boxId: string): Promise<void> {
    this.fresh.delete(boxId);
    const ds = this.d.boxDataset(boxId);
    // Most roots are no fork and have no snapshot: nothing else moves when they go, and they go
    // without the pool lock. One that gained a fork snapshot since it was looked at (a fork
    // accepted before this delete, running in its own turn) refuses the destroy ("dependent
    // clones", or a snapshot to destroy with it): it takes the locked path then.
    const r = await this.d.zfs(['list', '-H', '-o', 'name,origin', '-t', 'filesystem,snapshot', '-r', '-d', '1', ds], true);
    const rows = lines(r.stdout).map((l) => l.split('\t'));
    if (r.exitCode === 0 && rows.length === 1 && rows[0][0] === ds && !this.d.boxIdOf(rows[0][1] ?? '')) {
      const done = await this.d.destroyDataset(ds, false).then(
        () => true,
        (e: Error) => {
          if (/dependent clones|has children|snapshots/i.test(e.message)) return false;
          throw e;
        },
      );
      if (done) {
        await this.removeMountpoint(boxId);
        return;
      }
    }
    // Gone (its snapshots may still be to drop), forked, or a fork.
    await this.d.lock.run(() => this.destroyForkedRoot(boxId));
  }

  /** A root in a family of forks, under the pool lock: its forks promoted off it, then it goes,
   *  then its origin if it was the fork snapshot of a root and no other fork needs it. */
  private async destroyForkedRoot(boxId: string): Promise<void> {
    const ds = this.d.boxDataset(boxId);
    for (let attempt = 1; ; attempt++) {
      if (!(await this.d.exists(ds))) {
        // A fork that failed after its fork snapshot was taken leaves that snapshot on the source.
        await this.dropForkSnapshots(boxId);
        await this.removeMountpoint(boxId); // a retried delete: the link may have outlived the root
        return;
      }
      await this.promoteForks(ds);
      const origin = await this.d.prop(ds, 'origin');
      try {
        await this.d.destroyDataset(ds);
      } catch (e) {
        // A fork made meanwhile without the lock (its snapshot and clone take none): promote again.
        if (attempt < 3 && /dependent clones/.test(String(e))) continue;
        throw e;
      }
      // "does not exist" counts as done to the destroy: that must be because it is gone.
      if (await this.d.exists(ds)) throw new Error(`box root ${ds} is still there after its destroy`);
      await this.removeMountpoint(boxId);
      if (origin.includes('@')) await this.dropIfUnused(origin);
      return;
    }
  }

  /** The link to a destroyed root, and its mountpoint (zfs-fuse removes it itself; kernel ZFS may leave it). */
  private removeMountpoint(boxId: string): Promise<void> {
    return this.ranges.unlink(this.boxRootPath(boxId));
  }

  /** Forks hang off this root's snapshots. `zfs promote` hands those snapshots (and every older
   *  one) to a fork, after which nothing depends on the root and it can go. Runs under the pool
   *  lock: two of these racing would promote a fork whose origin already moved, i.e. over its base. */
  private async promoteForks(ds: string): Promise<void> {
    for (let round = 0; ; round++) {
      // Only a snapshot can be cloned: a root without one (most are) has no fork to promote,
      // and this asks about the one dataset instead of listing every filesystem of the pool
      // (which made each delete cost grow with the box count: ~2 s at 1000 boxes on zfs-fuse).
      if ((await this.d.snapshotsOf(ds)).length === 0) return;
      const dependents = await this.d.snapshotClones(ds);
      if (dependents.size === 0) return;
      if (round >= 32) throw new Error(`box root ${ds}: forks still depend on it after ${round} promotions`);
      let newest: { snap: string; clone: string } | undefined;
      for (const snap of await this.d.snapshotsOf(ds)) {
        const clones = dependents.get(snap);
        if (!clones) {
          // It dies with the root anyway; destroying it now keeps promote from moving it.
          await this.d.destroySnapshot(snap);
          continue;
        }
        // Promote would carry user names onto the fork, where they could collide with its own.
        const kept = snapName(snap).startsWith(INTERNAL) ? snap : await this.d.hide(snap);
        newest = { snap: kept, clone: clones[0] };
      }
      if (!newest) continue;
      const fork = this.d.boxIdOf(newest.clone);
      if (!fork) throw new Error(`${newest.clone} is cloned from ${newest.snap} but is no box root; refusing to promote it`);
      // Promoting a clone whose origin is no longer ours would steal its new origin's snapshots.
      if ((await this.d.prop(newest.clone, 'origin')) !== newest.snap) continue;
      this.d.log.info({ dataset: ds, fork }, 'promoting fork before destroying its origin');
      await this.promoteOverQuota(newest.clone);
    }
  }

  /** `zfs promote` hands the origin's snapshots (and their space) to the fork, which its quota
   *  may not hold: the quota is lifted for the promote, then put back (or, when the fork now
   *  uses more, set to what it uses: it can write nothing more until it frees space). */
  private async promoteOverQuota(clone: string): Promise<void> {
    const quota = await this.d.prop(clone, 'quota');
    if (quota !== '0') await this.d.zfs(['set', 'quota=none', clone]);
    try {
      await this.d.zfs(['promote', clone]);
    } finally {
      if (quota !== '0') {
        const r = await this.d.zfs(['set', `quota=${quota}`, clone], true);
        if (r.exitCode !== 0) {
          const used = await this.d.prop(clone, 'used');
          this.d.log.warn({ dataset: clone, quota, used }, 'fork uses more than its quota after the promote; quota set to its use');
          await this.d.zfs(['set', `quota=${used}`, clone]);
        }
      }
    }
  }

  async listBoxRoots(): Promise<string[]> {
    const parent = `${this.d.root}/boxes`;
    const r = await this.d.zfs(['list', '-H', '-o', 'name', '-t', 'filesystem', '-r', '-d', '1', parent]);
    return lines(r.stdout)
      .filter((n) => n !== parent)
      .map((n) => n.slice(parent.length + 1));
  }

  /** Destroys an internal box snapshot once no clone needs it; user snapshots and bases stay. */
  async dropIfUnused(snap: string): Promise<void> {
    if (!this.d.boxIdOf(snap) || !snapName(snap).startsWith(INTERNAL)) return;
    if (!(await this.d.exists(snap))) return;
    if ((await this.d.clonesOf(snap)).length > 0) return;
    await this.d.destroySnapshot(snap);
  }

  private async dropForkSnapshots(boxId: string): Promise<void> {
    const r = await this.d.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', `${this.d.root}/boxes`]);
    for (const snap of lines(r.stdout)) {
      if (snapName(snap) === `${INTERNAL}fork-${boxId}`) await this.dropIfUnused(snap);
    }
  }
}
