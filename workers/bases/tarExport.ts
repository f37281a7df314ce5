import fs from 'node:fs';
import { Readable } from 'node:stream';
import { create } from 'tar';

/**
 * A base's root filesystem as a plain tar stream, its entries at the tar root as `docker export`
 * writes them (`bin/sh`, `etc/passwd`: DESIGN.md §6), owners as numbers, symlinks as symlinks,
 * hard links as links. Read from the base's read-only dataset, so it is the same every time.
 */
export async function packBase(root: string): Promise<Readable> {
  const names = (await fs.promises.readdir(root)).sort();
  // An empty root is an empty archive (two zero blocks), not an error.
  if (names.length === 0) return Readable.from([Buffer.alloc(1024)]);
  return create({ cwd: root, portable: false, follow: false, strict: true }, names) as unknown as Readable;
}
