/**
 * Names, rules and small helpers shared by the ZFS storage's parts (zfs.ts and the modules it
 * is made of): dataset name checks, the properties boxhost sets, how zfs-fuse's answers read.
 */
import fs from 'node:fs';
import path from 'node:path';

/** zfs-fuse mounts kept for what a node mounts besides box roots once it runs (`rootLimit`). */
export const ROOT_MOUNT_RESERVE = 16;
// zfs-fuse can hang when its daemon wedges; a bounded wait turns that into an error.
export const CMD_TIMEOUT_MS = 120_000;
// "dataset is busy" right after use clears within ~10-30 ms here; 12 tries cover ~6 s.
export const BUSY_TRIES = 12;
export const BASE_SNAPSHOT = 'base';
export const INTERNAL = '_';
/** User property of a box root (and its snapshots): the first host id of the range its files
 *  are owned in, or `none` (a snapshot taken before the root was shifted in place). */
export const IDMAP_PROP = 'boxhost:idmap';
/** User property of a shifted base copy being made: `<pid>` of the process making it. */
export const MAKER_PROP = 'boxhost:maker';
/** User property of a box snapshot: the description its maker gave (one line, no tabs). */
export const DESCRIPTION_PROP = 'boxhost:description';
/** Box roots (and data volumes) never honour setuid bits or device nodes. */
export const PRIVATE_MOUNT = ['setuid=off', 'devices=off'];

const COMPONENT = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
export const USER_SNAPSHOT = /^[A-Za-z0-9][A-Za-z0-9.:-]{0,127}$/;

export const noop = () => {};

/**
 * zfs-fuse's daemon hands each new mount to its FUSE listener threads through one pipe, in two
 * write(2)s (the mount's record, then its path: zfsfuse_newfs in src/zfs-fuse/fuse_listener.c),
 * from whichever of its 8 ioctl workers ran the mount. Two mounts at once can interleave those
 * writes; the listener then reads a path length out of another mount's bytes (seen here: 879 MB)
 * and waits in read(2) for it while holding the lock every FUSE request of the machine needs: the
 * data path of every pool hangs for good, while `zpool list` still answers (issue 13's hang,
 * caught 2026-11-29 with the listener thread in read(fd 6, …, 0x346b62f1)). So commands that
 * mount on a zfs-fuse machine take turns machine-wide, every process and pool alike, on this
 * file (core/command.ts RunOptions.lockFile). Kernel ZFS mounts through mount(2): no lock. In a
 * directory only root can make (a lock file in /run/lock, which anyone may write, could be taken
 * by any user first and held).
 */
export const ZFS_FUSE_MOUNT_LOCK = '/run/boxhost/zfs-fuse-mounts.lock';

/** Makes the mount lock's file (root's only: flock needs no write access, so a file others
 *  could open would let them hold the lock) and answers its path. */
export function ensureMountLock(): string {
  fs.mkdirSync(path.dirname(ZFS_FUSE_MOUNT_LOCK), { recursive: true, mode: 0o755 });
  fs.closeSync(fs.openSync(ZFS_FUSE_MOUNT_LOCK, 'a', 0o600));
  fs.chmodSync(ZFS_FUSE_MOUNT_LOCK, 0o600);
  return ZFS_FUSE_MOUNT_LOCK;
}

/** Whether `zfs <args>` (or `zpool <args>` with `zpool`) may mount a filesystem. */
export function mayMount(args: readonly string[], zpool = false): boolean {
  const [verb, ...rest] = args;
  if (zpool) return verb === 'create' || verb === 'import';
  switch (verb) {
    case 'clone':
    case 'create':
    case 'mount':
    case 'rename':
    case 'rollback':
    case 'promote':
      return true;
    case 'receive':
    case 'recv':
      return !rest.includes('-u');
    case 'set':
    case 'inherit':
      return rest.some((a) => /^(mountpoint|canmount)(=|$)/.test(a));
    default:
      return false;
  }
}

export const isMissing = (text: string) => /does not exist|no such pool|could not find any snapshots/i.test(text);
export const isBusy = (text: string) => /is busy|device busy/i.test(text);
export const isExists = (text: string) => /already exists/i.test(text);

export function checkComponent(what: string, value: string): void {
  if (!COMPONENT.test(value)) throw new Error(`invalid ${what} ${JSON.stringify(value)} for a ZFS dataset name`);
}
export function checkTag(value: string): void {
  if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(value)) throw new Error(`invalid hold tag ${JSON.stringify(value)}`);
}
export function checkUserSnapshot(value: string): void {
  if (!USER_SNAPSHOT.test(value)) throw new Error(`invalid snapshot name ${JSON.stringify(value)}`);
}

export function binary(name: string): string {
  for (const dir of ['/usr/sbin', '/sbin', '/usr/local/sbin']) {
    const p = path.join(dir, name);
    if (fs.existsSync(p)) return p;
  }
  return name;
}

export function lines(s: string): string[] {
  return s.split('\n').filter((l) => l.length > 0);
}

export function snapName(snap: string): string {
  return snap.slice(snap.indexOf('@') + 1);
}

export function bytes(n: number): string {
  return n >= 1024 ** 3 ? `${(n / 1024 ** 3).toFixed(1)} GiB` : `${Math.round(n / 1024 ** 2)} MiB`;
}

export function quotaArg(gb: number): string {
  return Number.isInteger(gb) ? `${gb}G` : String(Math.round(gb * 1024 ** 3));
}

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

const locks = new Map<string, Promise<unknown>>();

/** Runs `fn` after every earlier call with the same key in this process has finished. */
export function serialized<T>(key: string, fn: () => Promise<T>): Promise<T> {
  const next = (locks.get(key) ?? Promise.resolve()).then(fn, fn);
  const settled = next.catch(noop);
  locks.set(key, settled);
  void settled.then(() => {
    if (locks.get(key) === settled) locks.delete(key);
  });
  return next;
}
