import fs from 'node:fs';
import { Readable } from 'node:stream';
import { Pack } from 'tar';

/**
 * A base's root filesystem as a plain tar stream, its entries at the tar root as `docker export`
 * writes them (`bin/sh`, `etc/passwd`: DESIGN.md §6), owners as numbers, symlinks as symlinks,
 * hard links as links. Read from the base's read-only dataset, so it is the same every time.
 */
export async function packBase(root: string): Promise<Readable> {
  const names = (await fs.promises.readdir(root)).sort();
  // Each name added as a path: `create(opts, names)` would read a name that starts with `@` as
  // "append the archive at this path", following a symlink of the base out to the host.
  const pack = new Pack({ cwd: root, portable: false, follow: false, strict: true });
  // An empty root is the root directory alone (an archive with no entry is not one node-tar reads back).
  for (const n of names.length > 0 ? names : ['.']) pack.add(n);
  pack.end();
  return pack as unknown as Readable;
}
