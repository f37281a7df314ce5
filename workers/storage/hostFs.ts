/**
 * What the storage driver and its daemon need to know of the host's own filesystems: mount
 * flags, FUSE mounts, pidfiles. Plain functions over /proc, no ZFS.
 */
import fs from 'node:fs';
import path from 'node:path';

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export const isPrivateMount = (flags: Set<string> | null) => flags !== null && flags.has('nosuid') && flags.has('nodev');

/**
 * The options of the mount at exactly `dir` (from /proc/self/mountinfo), or null if none.
 * Asked on every box create and start: the file (which the kernel writes out whole at each
 * read, ~3 lines per box) is read off the event loop, and only the lines naming `dir` are
 * split. Read synchronously and split whole, it took 15% of a node's event loop at 700 boxes
 * (bench scale).
 */
export async function mountFlags(dir: string): Promise<Set<string> | null> {
  let info: string;
  try {
    info = await fs.promises.readFile('/proc/self/mountinfo', 'utf8');
  } catch {
    return null;
  }
  return mountFlagsIn(info, dir);
}

/** mountFlags over a mountinfo text: the last mount at `dir` is the one in effect. */
export function mountFlagsIn(info: string, dir: string): Set<string> | null {
  const needle = ` ${dir.replace(/ /g, '\\040')} `;
  for (let at = info.lastIndexOf(needle); at >= 0; at = at > 0 ? info.lastIndexOf(needle, at - 1) : -1) {
    const start = info.lastIndexOf('\n', at) + 1;
    const end = info.indexOf('\n', at);
    const f = info.slice(start, end < 0 ? undefined : end).split(' ');
    // The needle may be another field (a bind mount's root in its filesystem): field 5 is the point.
    if (f[4]?.replace(/\\040/g, ' ') === dir) return new Set(f[5].split(','));
  }
  return null;
}

/** Mount points strictly under `dir`, deepest first (from /proc/self/mountinfo). */
export function mountsUnder(dir: string): string[] {
  const prefix = path.resolve(dir) + '/';
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => (l.split(' ')[4] ?? '').replace(/\\040/g, ' '))
    .filter((m) => m.startsWith(prefix))
    .sort((a, b) => b.length - a.length);
}

export function mountedUnder(dir: string): boolean {
  try {
    return mountsUnder(dir).length > 0;
  } catch {
    return true;
  }
}

export function removeEmptyDirs(dir: string): void {
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) if (e.isDirectory()) removeEmptyDirs(path.join(dir, e.name));
  try {
    fs.rmdirSync(dir);
  } catch {
    // not empty: something that is not ours stays
  }
}

/** The directory a path names, following a symlink even when its target does not exist yet. */
export function realDir(p: string): string {
  try {
    if (fs.lstatSync(p).isSymbolicLink()) return path.resolve(path.dirname(p), fs.readlinkSync(p));
  } catch {
    // absent: made as it is named
  }
  return p;
}

export function removeStalePidfile(pidfile: string, comm: string): void {
  let pid: string;
  try {
    pid = fs.readFileSync(pidfile, 'utf8').trim();
  } catch {
    return;
  }
  try {
    if (/^\d+$/.test(pid) && fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === comm) return;
  } catch {
    // no such process
  }
  fs.rmSync(pidfile, { force: true });
}

/** The mount points of FUSE filesystems whose source is `pool` or one of its datasets, deepest
 *  first (the order they can be unmounted in). */
export function fuseMountsOf(pool: string): string[] {
  let mounts: string;
  try {
    mounts = fs.readFileSync('/proc/self/mounts', 'utf8');
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const line of mounts.split('\n')) {
    const [source, point, type] = line.split(' ');
    if (!point || !/^fuse/.test(type ?? '')) continue;
    if (source === pool || source?.startsWith(`${pool}/`)) out.push(point.replace(/\\040/g, ' '));
  }
  return [...new Set(out)].sort((a, b) => b.length - a.length);
}
