import fs from 'node:fs';
import path from 'node:path';
import type { IdMap } from '../../core/box';
import { run } from '../../core/command';

const GETCAP = '/usr/sbin/getcap';
const SETCAP = '/usr/sbin/setcap';
/** Entries shifted at once within one directory (the FUSE round trips overlap). */
const PARALLEL = 32;

/**
 * Moves the ownership of every entry under `dir` (and `dir` itself) from box ids 0…size-1 to
 * host ids hostId…, so that root in a box whose user namespace maps 0 → hostId owns its files.
 * Done once for a base's copy in a project's range (workers/storage/zfsBases.ts caches it), and once
 * in place for a box root made before user namespaces.
 *
 * - Never follows a symlink (lchown; symlinks stay symlinks) and never leaves `dir` (no mount
 *   points are crossed: each entry is looked at with lstat, directories read by their path).
 * - A hard-linked inode is shifted once, not once per name.
 * - An id past the range (a base file owned by uid 100000) becomes the range's `nobody`
 *   (box id 65534 or the last id), never an id of the next project's range.
 * - chown(2) clears setuid/setgid bits and file capabilities: the mode is put back, and the
 *   capabilities are written again as namespaced ones (v3, rootid = hostId), which is what
 *   makes them effective inside the box's user namespace at all. Filesystems without extended
 *   attributes (zfs-fuse) have no capabilities to keep.
 */
export async function shiftTree(dir: string, idMap: IdMap): Promise<{ entries: number }> {
  const nobody = Math.min(65534, idMap.size - 1);
  return remapTree(dir, (id) => idMap.hostId + (id < idMap.size ? id : nobody), idMap.hostId);
}

/**
 * The way back (a base saved from a box): owners in `idMap`'s range go back to box ids 0…size-1,
 * any other owner (a host id that is not the box's) to nobody (65534). Capabilities are written
 * again as plain ones (no namespace root). Same walk and guarantees as `shiftTree`.
 */
export async function unshiftTree(dir: string, idMap: IdMap): Promise<{ entries: number }> {
  const inRange = (id: number) => id >= idMap.hostId && id < idMap.hostId + idMap.size;
  return remapTree(dir, (id) => (inRange(id) ? id - idMap.hostId : 65534), null);
}

async function remapTree(dir: string, mapId: (id: number) => number, capsRootId: number | null): Promise<{ entries: number }> {
  const caps = await readCapabilities(dir);
  const seenInodes = new Set<number>();
  // Capabilities are written back only on regular files this walk saw (never through a link):
  // getcap's output is lines of unescaped names, which a file name can forge.
  const files = new Set<string>();
  const shift = mapId;
  let entries = 0;

  const one = async (p: string): Promise<fs.Stats> => {
    const st = await fs.promises.lstat(p);
    if (st.nlink > 1 && !st.isDirectory()) {
      if (seenInodes.has(st.ino)) return st;
      seenInodes.add(st.ino);
    }
    if (st.isFile()) files.add(path.normalize(p));
    await fs.promises.lchown(p, shift(st.uid), shift(st.gid));
    if (!st.isSymbolicLink() && (st.mode & 0o6000) !== 0) await fs.promises.chmod(p, st.mode & 0o7777);
    entries++;
    return st;
  };

  const stack = [dir];
  await one(dir);
  for (let d = stack.pop(); d !== undefined; d = stack.pop()) {
    const names = await fs.promises.readdir(d);
    for (let i = 0; i < names.length; i += PARALLEL) {
      const batch = names.slice(i, i + PARALLEL).map((n) => path.join(d!, n));
      const stats = await Promise.all(batch.map(one));
      stats.forEach((st, j) => st.isDirectory() && stack.push(batch[j]));
    }
  }
  for (const { file, text } of caps.filter((c) => files.has(path.normalize(c.file)))) await run(capsRootId === null ? [SETCAP, text, file] : [SETCAP, '-n', String(capsRootId), text, file]);
  return { entries };
}

/** Files under `dir` with capabilities, as `getcap -r` (which does not follow links) lists
 *  them: `<path> <caps>[ [rootid=N]]`. */
async function readCapabilities(dir: string): Promise<{ file: string; text: string }[]> {
  if (!fs.existsSync(GETCAP)) throw new Error(`${GETCAP} is missing (libcap2-bin): run scripts/install-host.sh`);
  const r = await run([GETCAP, '-r', dir], { allowFailure: true });
  const out: { file: string; text: string }[] = [];
  for (const line of r.stdout.split('\n')) {
    const m = /^(.*?) ((?:=|cap_)[a-z_,0-9]*[=+-][eip]*(?: (?:=|cap_)[a-z_,0-9]*[=+-][eip]*)*)(?: \[rootid=\d+\])?$/.exec(line);
    // getcap does not escape names: a file named "x\nvictim cap_sys_admin+ep" makes a line of
    // its own. Only absolute paths under `dir` are believed (a name's tail has no `/`).
    if (m && m[1].startsWith(`${dir.replace(/\/+$/, '')}/`) && !m[1].split('/').includes('..')) out.push({ file: m[1], text: m[2] });
  }
  return out;
}
