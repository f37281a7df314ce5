/**
 * Where a project's box roots are mounted on the host: behind a directory of its id range that
 * only that range can enter (docs/security.md "Escapes"). A box's root user is its range's first
 * host id; runc's container init walks to the root as that user, so the path must stay open to
 * it, and to it alone: `<mount root>/by-range/<first host id>` is `root:<first host id>` 0750,
 * and a root of the range is mounted at `…/by-range/<id>/boxes/<box id>` (its dataset's own
 * `mountpoint`). An escape from a box as its range's user (the runc here lacks the 2024–2025
 * fixes) then reaches no other project's files: before, every root sat in `<mount root>/boxes`
 * (0755) with its top directory 0755, and another range could read and write what the box's
 * own users could.
 *
 * `<mount root>/boxes/<box id>`, where a root was mounted before, is a symlink to the real
 * mount, so every path to a root stays what it was; a root of the old layout (a mounted
 * directory there) is moved behind its range at its next start (`placeBehindRange`).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { IdMap } from '../drivers';
import { ownDir } from '../hostDirs';

export const RANGES_DIR = 'by-range';

export class RangeDirs {
  /** Ranges whose directories this process has made or found as they must be (until `forget`). */
  private readonly ensured = new Set<number>();

  constructor(private readonly mountRoot: () => string) {}

  /** Whether `ensure` has succeeded for this range in this process (since the last `forget`). */
  known(idMap: IdMap): boolean {
    return this.ensured.has(idMap.hostId);
  }

  /** After a restart of the storage daemon: every range is looked at again before its next clone. */
  forget(): void {
    this.ensured.clear();
  }

  /**
   * The directory of `idMap`'s range: made, and made `root:<range>` 0750, before anything is
   * mounted in it; its parent 0711 (entered by every range, listed by none) and its `boxes`
   * 0755, whatever the umask made them: a directory on a root's path without traversal for
   * everyone is one the runtime would open (workers/runtime/reach.ts). Modes are set, not
   * asked of mkdir; made and checked at every start (a mkdir and three lstats).
   */
  async ensure(idMap: IdMap): Promise<string> {
    const dir = path.join(this.mountRoot(), RANGES_DIR, String(idMap.hostId));
    try {
      await fs.promises.mkdir(path.join(dir, 'boxes'), { recursive: true, mode: 0o700 });
      await Promise.all([
        ownDir(path.dirname(dir), 0, 0, 0o711),
        ownDir(dir, 0, idMap.hostId, 0o750),
        ownDir(path.join(dir, 'boxes'), 0, 0, 0o755),
      ]);
    } catch (e) {
      this.ensured.delete(idMap.hostId);
      throw e;
    }
    this.ensured.add(idMap.hostId);
    return dir;
  }

  /** Where a root of `idMap`'s range is mounted. */
  rootMount(boxId: string, idMap: IdMap): string {
    return path.join(this.mountRoot(), RANGES_DIR, String(idMap.hostId), 'boxes', boxId);
  }

  /**
   * Makes `link` (the root's path of old, `<mount root>/boxes/<box id>`) a symlink to `target`.
   * A symlink there already is replaced when it points elsewhere; an empty directory (a
   * mountpoint left behind) is removed; a mounted root of the old layout is left as it is
   * (answers false: the caller moves it first).
   */
  async link(link: string, target: string): Promise<boolean> {
    const st = await fs.promises.lstat(link).catch(() => null);
    if (st?.isSymbolicLink()) {
      if ((await fs.promises.readlink(link)) === target) return true;
      await fs.promises.unlink(link);
    } else if (st?.isDirectory()) {
      if (await isMountpoint(link)) return false;
      await fs.promises.rmdir(link); // empty, or this fails: nothing is removed under a root
    } else if (st) {
      throw new Error(`${link} is neither a directory nor a symlink`);
    }
    await fs.promises.symlink(target, link).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
    return true;
  }

  /** Removes `link` and, once its dataset is gone, the mountpoint it named (kernel ZFS may
   *  leave it; zfs-fuse removes it itself). A directory there (a root of the old layout) is
   *  removed if empty. */
  async unlink(link: string): Promise<void> {
    const st = await fs.promises.lstat(link).catch(() => null);
    if (!st) return;
    if (st.isSymbolicLink()) {
      const target = await fs.promises.readlink(link);
      await fs.promises.unlink(link).catch(() => undefined);
      await fs.promises.rmdir(target).catch(() => undefined);
    } else if (st.isDirectory()) {
      await fs.promises.rmdir(link).catch(() => undefined);
    }
  }
}

/** Whether `dir` is the top of a mount (its device differs from its parent's). */
async function isMountpoint(dir: string): Promise<boolean> {
  const [a, b] = await Promise.all([fs.promises.stat(dir), fs.promises.stat(path.dirname(dir))]);
  return a.dev !== b.dev;
}
