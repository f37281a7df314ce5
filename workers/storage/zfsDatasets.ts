/**
 * One pool's datasets as the ZFS storage's parts use them: every `zfs` command (gated per pool,
 * with a deadline), the reads and the idempotent destroys and mounts that cope with zfs-fuse
 * (busy answers right after use, mounts racing), the names of bases, shifted copies and box
 * roots, and the pool lock (PoolLock). Data volumes get it as their `ZfsKit`.
 */
import crypto from 'node:crypto';
import { CommandError, isLockTimeout, run, sleep, type RunResult } from '../../core/command';
import type { BaseRef, BoxSnapshotInfo, DriverLogger, IdMap } from '../drivers';
import { isPrivateMount, mountFlags } from './hostFs';
import { PoolLock } from './poolLock';
import { makePrivate, remountPrivate } from '../../core/spawner';
import { binary, BUSY_TRIES, checkComponent, CMD_TIMEOUT_MS, DESCRIPTION_PROP, Gate, INTERNAL, isBusy, isMissing, lines, mayMount, serialized, snapName } from './zfsCommon';

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
  /** The storage daemon's pid (zfs-fuse), null when there is none (kernel ZFS) or it is down: a
   *  change means the daemon was restarted, which mounts every dataset anew. */
  daemonPid(): number | null;
  snapshotsOf(ds: string): Promise<string[]>;
  /** The user snapshots of `ds` (internal `_` ones left out), oldest first, and what `ds` uses
   *  (0 without `withUsage`); `missing` is the error when `ds` does not exist. */
  userSnapshots(ds: string, missing: string, withUsage?: boolean): Promise<{ usedBytes: number; snapshots: BoxSnapshotInfo[] }>;
  destroySnapshot(snap: string): Promise<void>;
  destroyDataset(ds: string): Promise<void>;
  retryBusy(what: string, attempt: () => Promise<RunResult | null>): Promise<void>;
  /** Runs `fn` after every earlier serialized call on this pool's volumes in this process. */
  serialized<T>(fn: () => Promise<T>): Promise<T>;
}

const DEFAULT_ZFS_CONCURRENCY = 4;
/** The exit code `timed` answers for a command never started (its mount lock not free in time). */
export const NOT_STARTED = -1;
/** The turn (core `serialized`) this process's commands that mount take before the gate. */
const MOUNTS_TURN = 'zfs-fuse:mounts';
const gates = new Map<string, Gate>();
/** One gate per pool in the process: several drivers of one pool (a test's, a node's) share it. */
function gateOf(pool: string, limit: number): Gate {
  let g = gates.get(pool);
  if (!g) gates.set(pool, (g = new Gate(limit)));
  return g;
}

export interface ZfsDatasetsOptions {
  pool: string;
  root: string;
  /** Where R is mounted until `init` reads it. */
  mountRoot: string;
  lockFile: string;
  concurrency?: number;
  log: DriverLogger;
  /** The zfs-fuse daemon's pid, if one is known: a command killed at its deadline names it. */
  daemonPid: () => number | null;
  /** The machine-wide lock that commands which mount hold (ZFS_FUSE_MOUNT_LOCK), on zfs-fuse. */
  mountLock?: string;
}

export class ZfsDatasets implements ZfsKit {
  readonly pool: string;
  readonly root: string;
  readonly zfsBin = binary('zfs');
  readonly zpoolBin = binary('zpool');
  /** Taken by what moves snapshots between box roots (PoolLock, across the node's processes). */
  readonly lock: PoolLock;
  /** How long a `zfs`/`zpool` command may run (shorter while the node starts: `init`). */
  cmdTimeoutMs = CMD_TIMEOUT_MS;
  /** The daemon (its pid; null: none known) when a command was killed for giving no answer
   *  since this was last cleared; undefined: none was. */
  hungDaemon: number | null | undefined;
  private mountedAt: string;

  constructor(private readonly opts: ZfsDatasetsOptions) {
    this.pool = opts.pool;
    this.root = opts.root;
    this.mountedAt = opts.mountRoot;
    this.lock = new PoolLock(opts.lockFile, opts.log);
  }

  get log(): DriverLogger {
    return this.opts.log;
  }

  mountRoot(): string {
    return this.mountedAt;
  }

  setMountRoot(dir: string): void {
    this.mountedAt = dir;
  }

  /** Volumes' own turns (in this process, as before the pool lock): a volume takes part in no
   *  promote, and a restore's `zfs receive` would hold the pool lock for minutes. */
  serialized<T>(fn: () => Promise<T>): Promise<T> {
    return serialized(`${this.pool}:volumes`, fn);
  }

  // ---------------------------------------------------------------- names

  baseDataset(base: BaseRef): string {
    checkComponent('base name', base.name);
    checkComponent('base version', base.version);
    return `${this.root}/bases/${base.name}/${base.version}`;
  }

  shiftedDataset(base: BaseRef, idMap: IdMap): string {
    return `${this.baseDataset(base).replace(`${this.root}/bases/`, `${this.root}/shifted/`)}/${idMap.hostId}`;
  }

  boxDataset(boxId: string): string {
    checkComponent('box id', boxId);
    return `${this.root}/boxes/${boxId}`;
  }

  boxIdOf(dataset: string): string | undefined {
    const prefix = `${this.root}/boxes/`;
    if (!dataset.startsWith(prefix)) return undefined;
    return dataset.slice(prefix.length).split('@')[0];
  }

  // ---------------------------------------------------------------- commands

  /**
   * Every `zfs` command goes through here, at most `concurrency` at once per pool in this
   * process (docs/decisions.md "Storage"): twenty creates or deletes at once otherwise queue
   * dozens of commands inside zfs-fuse, where the watchdog's `zpool list` and the health check
   * wait behind them and a busy daemon looks hung. Those looks use `zpool`, which is not gated.
   * A command holds its place only while it runs, or while it waits for the machine's mount
   * lock (commands that mount, on zfs-fuse: one at a time per process), which no command waits
   * on the gate to let go: the gate cannot deadlock.
   */
  zfs(args: string[], allowFailure = false): Promise<RunResult> {
    const gate = gateOf(this.pool, this.opts.concurrency ?? DEFAULT_ZFS_CONCURRENCY);
    if (!(this.opts.mountLock && mayMount(args))) return gate.run(() => this.timed([this.zfsBin, ...args], allowFailure));
    // One command that mounts at a time from this process reaches the gate: while it waits for
    // the machine's mount lock it holds a place there, which other commands then wait behind.
    const lockFile = this.opts.mountLock;
    return serialized(MOUNTS_TURN, () => gate.run(() => this.timed([this.zfsBin, ...args], allowFailure, lockFile)));
  }

  zpool(args: string[], allowFailure = false): Promise<RunResult> {
    return this.timed([this.zpoolBin, ...args], allowFailure, this.opts.mountLock && mayMount(args, true) ? this.opts.mountLock : undefined);
  }

  /**
   * A command killed at its deadline (no exit code) is remembered: `init` asks. `lockFile`: held
   * while it runs (commands that mount, on zfs-fuse: ZFS_FUSE_MOUNT_LOCK). One never started
   * because its lock was not free in time is no sign of a hung daemon: with `allowFailure` it
   * answers as a failure like any other (exit code NOT_STARTED, the reason as stderr), so every
   * caller's failure path (a fork's snapshot dropped, a move tried at a later start, a new pool's
   * image removed) covers it too.
   */
  async timed(argv: string[], allowFailure: boolean, lockFile?: string): Promise<RunResult> {
    try {
      const r = await run(argv, { allowFailure, timeoutMs: this.cmdTimeoutMs, lockFile });
      if (r.exitCode === null) this.hungDaemon = this.opts.daemonPid();
      return r;
    } catch (e) {
      if (e instanceof CommandError && e.exitCode === null) this.hungDaemon = this.opts.daemonPid();
      if (allowFailure && isLockTimeout(e)) return { exitCode: NOT_STARTED, stdout: '', stderr: (e as Error).message };
      throw e;
    }
  }

  /** Runs a mutation whose "already done" failure counts as success (concurrent or retried jobs). */
  async zfsTolerating(args: string[], done: (stderr: string) => boolean): Promise<void> {
    const r = await this.zfs(args, true);
    if (r.exitCode !== 0 && !done(r.stderr)) throw new CommandError([this.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  async exists(name: string): Promise<boolean> {
    const r = await this.zfs(['list', '-H', '-o', 'name', name], true);
    if (r.exitCode === 0) return true;
    if (isMissing(r.stderr)) return false;
    throw new CommandError([this.zfsBin, 'list', name], r.exitCode, r.stdout, r.stderr);
  }

  async prop(name: string, property: string): Promise<string> {
    return (await this.zfs(['get', '-Hp', '-o', 'value', property, name])).stdout.trim();
  }

  /** Property values by dataset; with `setOnly`, a user property that is not set (source `-`)
   *  is left out rather than answered as `-`. */
  async props(names: string[], properties: string[], setOnly = false): Promise<Map<string, Map<string, string>>> {
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
  async ensureMounted(ds: string): Promise<void> {
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
  async snapshotsOf(ds: string): Promise<string[]> {
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', '-d', '1', ds]);
    return lines(r.stdout).filter((s) => s.startsWith(`${ds}@`));
  }

  async userSnapshots(ds: string, missing: string, withUsage = true): Promise<{ usedBytes: number; snapshots: BoxSnapshotInfo[] }> {
    const r = await this.zfs(['list', '-H', '-o', 'name', '-t', 'snapshot', '-r', '-d', '1', ds], true);
    if (r.exitCode !== 0) {
      if (isMissing(r.stderr)) throw new Error(missing);
      throw new CommandError([this.zfsBin, 'list', ds], r.exitCode, r.stdout, r.stderr);
    }
    const snaps = lines(r.stdout).filter((s) => s.startsWith(`${ds}@`) && !snapName(s).startsWith(INTERNAL));
    if (!withUsage && snaps.length === 0) return { usedBytes: 0, snapshots: [] };
    const props = await this.props([...(withUsage ? [ds] : []), ...snaps], ['creation', 'used', DESCRIPTION_PROP], true);
    // `zfs list` answers snapshots in creation order (createtxg), finer than `creation` seconds.
    const snapshots = snaps.map((s): BoxSnapshotInfo => {
      const description = props.get(s)?.get(DESCRIPTION_PROP);
      return {
        name: snapName(s),
        createdAt: new Date(Number(props.get(s)?.get('creation') ?? 0) * 1000).toISOString(),
        sizeBytes: Number(props.get(s)?.get('used') ?? 0),
        ...(description !== undefined ? { description } : {}),
      };
    });
    return { usedBytes: Number(props.get(ds)?.get('used') ?? 0), snapshots };
  }

  /** origin snapshot → the filesystems cloned from it, for every snapshot of `ds`.
   *  zfs-fuse has no `clones` property, so the pool's origins are read instead. */
  async snapshotClones(ds: string): Promise<Map<string, string[]>> {
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
  async descendantsOf(ds: string): Promise<string[]> {
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

  async clonesOf(snap: string): Promise<string[]> {
    return (await this.snapshotClones(snap.split('@')[0])).get(snap) ?? [];
  }

  /** Renames a snapshot to a unique internal name: it leaves listings and frees its name. */
  async hide(snap: string): Promise<string> {
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

  async destroySnapshot(snap: string): Promise<void> {
    await this.retryBusy(`zfs destroy ${snap}`, async () => {
      const r = await this.zfs(['destroy', snap], true);
      return r.exitCode === 0 || isMissing(r.stderr) ? null : r;
    });
  }

  /** Destroys a filesystem and its snapshots. zfs-fuse reports "dataset is busy" for a dataset
   *  that was just used, even with -f: unmount first, then retry with a short pause. */
  async destroyDataset(ds: string, recursive = true): Promise<void> {
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
  async retryBusy(what: string, attempt: () => Promise<RunResult | null>, alsoTransient: (stderr: string) => boolean = () => false): Promise<void> {
    for (let i = 1; ; i++) {
      const r = await attempt();
      if (r === null) return;
      if (!(isBusy(r.stderr) || alsoTransient(r.stderr)) || i >= BUSY_TRIES) throw new Error(`${what} failed: ${r.stderr.trim() || r.stdout.trim()}`);
      await sleep(Math.min(25 * 2 ** (i - 1), 1000));
    }
  }

  daemonPid(): number | null {
    return this.opts.daemonPid();
  }

  /** zfs-fuse mounts without nosuid,nodev whatever `setuid` and `devices` say: the mount is
   *  made so by a bind remount, which changes only its flags. */
  async mountPrivately(dir: string): Promise<void> {
    // The check and the remount in one request to the node's helper (boxd/spawner.go
    // `makePrivate`): no read of the mount table here, ≈1–4 ms of the fs pool on a create's path.
    if ((await makePrivate(dir)) !== null) return;
    const flags = await mountFlags(dir);
    if (!flags || isPrivateMount(flags)) return;
    // Through the node's helper (a mount(2), where a `mount` process cost ≈12 ms of a create).
    if (await remountPrivate(dir, flags)) return;
    await run(['mount', '-o', 'remount,bind,nosuid,nodev', dir]);
  }
}
