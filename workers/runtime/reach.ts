import fs from 'node:fs';
import path from 'node:path';

/**
 * Root in a box is an unprivileged host user (its project's first host id), and runc's
 * container init runs as that user when it mounts the box's root directory and the bundle
 * files it bind-mounts: it must be able to walk down to them. A directory on such a path that
 * is private to the host's root (the data dir is made 0700) gets traversal for everyone (0711:
 * entering, never listing), and every other entry directly inside it loses what group and
 * others could do with it, so what was private through its directory stays private (the sqlite
 * file, for one, is created 0644; the admin token and the Redis directory are 0600/0700).
 */
export class HostPaths {
  /** Directories already looked at in this process: a start pays nothing after the first. */
  private readonly seen = new Set<string>();
  /** Directories a range enters as their owner or group, per range (`<host id>:<dir>`). */
  private readonly seenByRange = new Set<string>();
  private queue: Promise<void> = Promise.resolve();

  /** Makes every target reachable; one call at a time, so that no call takes away what
   *  another one's path needs. */
  makeReachable(targets: string[], hostId?: number): Promise<void> {
    const next = this.queue.then(() => this.open(targets, hostId));
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** A directory the range of `hostId` enters as its owner or group (a range's own directory,
   *  workers/storage/rangeDirs.ts) is reachable already: never opened to everyone. */
  private async open(targets: string[], hostId?: number): Promise<void> {
    const needed = new Set<string>();
    for (const t of targets) {
      const parts = path.resolve(t).split('/').filter(Boolean);
      for (let i = 0; i <= parts.length; i++) needed.add(`/${parts.slice(0, i).join('/')}`);
    }
    for (const dir of [...needed].sort()) {
      if (this.seen.has(dir) || targets.includes(dir) || this.seenByRange.has(`${hostId}:${dir}`)) continue;
      const st = await fs.promises.stat(dir);
      const ranges = hostId !== undefined && ((st.uid === hostId && st.mode & 0o100) || (st.gid === hostId && st.mode & 0o010));
      // Reachable for that range (its own directory, which the storage keeps so at every
      // create: workers/storage/rangeDirs.ts), and looked at no more for it.
      if (ranges) {
        this.seenByRange.add(`${hostId}:${dir}`);
        continue;
      }
      // A range's own directory that lost its group's traversal gets it back, never everyone's.
      if (hostId !== undefined && st.isDirectory() && st.uid === 0 && st.gid === hostId) {
        await fs.promises.chmod(dir, (st.mode & 0o7777) | 0o010);
        continue;
      }
      if (st.isDirectory() && (st.mode & 0o001) === 0) {
        await fs.promises.chmod(dir, (st.mode & 0o7777) | 0o011);
        await privateEntries(dir, needed);
      }
      this.seen.add(dir);
    }
  }
}

/** Takes group and other permissions off every entry of `dir` that no target needs. */
async function privateEntries(dir: string, needed: Set<string>): Promise<void> {
  for (const name of await fs.promises.readdir(dir)) {
    const p = path.join(dir, name);
    if (needed.has(p)) continue;
    const st = await fs.promises.lstat(p).catch(() => null);
    if (!st || st.isSymbolicLink() || (st.mode & 0o077) === 0) continue;
    // An entry whose group is not root's (a range's own directory, root:<range> 0750) keeps
    // what its group may do: taking it would shut the range out of its own roots.
    await fs.promises.chmod(p, st.mode & (st.gid !== 0 ? 0o7770 : 0o7700)).catch(() => undefined);
  }
}
