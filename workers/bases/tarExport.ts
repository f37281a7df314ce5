import fs from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tarStream from 'tar-stream';

/**
 * A base's root filesystem as a plain tar stream, its entries at the tar root as `docker export`
 * writes them (`bin/sh`, `etc/passwd`: DESIGN.md §6), owners as numbers, symlinks as symlinks,
 * hard links as links; sockets, FIFOs and devices are left out (a base holds none: the import
 * rules drop them). Read from the base's read-only dataset, so it is the same every time.
 *
 * The walk is ours (tar-stream only writes headers and bodies), so nothing is left open when the
 * reader goes away: destroying the stream ends the walk, and the file being read is closed with
 * it (node-tar's Pack kept such a file open for good, which kept the base's dataset busy).
 */
export async function packBase(root: string): Promise<Readable> {
  const pack = tarStream.pack();
  const names = (await fs.promises.readdir(root)).sort();
  let aborted = false;
  pack.once('close', () => void (aborted = true));
  const links = new Map<string, string>();
  const add = (header: Parameters<typeof pack.entry>[0], body?: string) =>
    new Promise<void>((resolve, reject) => pack.entry(header, body ?? '', (e) => (e ? reject(e) : resolve())));

  /** One path (relative to root, no leading `./`), then what is under it, in name order. */
  const walk = async (rel: string): Promise<void> => {
    if (aborted) return;
    const full = path.join(root, rel);
    const st = await fs.promises.lstat(full);
    // The whole st_mode: tar-stream keeps its permission bits (a mode of 0 alone it would replace
    // with a default, making a `----------` /etc/shadow readable after a round trip).
    const base = { name: rel, mode: st.mode, uid: st.uid, gid: st.gid, mtime: st.mtime };
    if (st.isDirectory()) {
      await add({ ...base, name: rel === '.' ? './' : `${rel}/`, type: 'directory' });
      if (rel === '.') return;
      for (const n of (await fs.promises.readdir(full)).sort()) await walk(`${rel}/${n}`);
    } else if (st.isSymbolicLink()) {
      await add({ ...base, type: 'symlink', linkname: await fs.promises.readlink(full) });
    } else if (st.isFile()) {
      const inode = `${st.dev}:${st.ino}`;
      const first = st.nlink > 1 ? links.get(inode) : undefined;
      if (first !== undefined) return add({ ...base, type: 'link', linkname: first });
      if (st.nlink > 1) links.set(inode, rel);
      if (st.size === 0) return add({ ...base, type: 'file', size: 0 });
      // O_NOFOLLOW: the path was a file when looked at (a base is read-only; still, never follow).
      const fh = await fs.promises.open(full, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
      let entry: ReturnType<typeof pack.entry>;
      try {
        if (aborted || pack.destroying) return void (await fh.close());
        entry = pack.entry({ ...base, type: 'file', size: st.size });
      } catch (e) {
        await fh.close();
        throw e;
      }
      // Exactly `size` bytes are read; the stream closes its file however it ends (a destroyed
      // pack destroys the entry being written, which ends the pipeline).
      await pipeline(fs.createReadStream(full, { fd: fh, start: 0, end: st.size - 1 }), entry);
    }
  };

  void (async () => {
    try {
      for (const n of names.length > 0 ? names : ['.']) await walk(n === '.' ? '.' : n);
      if (!aborted) pack.finalize();
    } catch (e) {
      pack.destroy(e as Error);
    }
  })();
  return pack as unknown as Readable;
}
