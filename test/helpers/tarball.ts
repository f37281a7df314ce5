import { Header, Pax } from 'tar';

export interface Member {
  path: string;
  type?: string;
  body?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  linkpath?: string;
}

/** A tar archive made header by header, so that any shape (absolute names, `..`) can be written. */
export function archive(members: Member[]): Buffer {
  const blocks: Buffer[] = [];
  for (const m of members) {
    const body = Buffer.from(m.body ?? '');
    const type = m.type ?? (m.path.endsWith('/') ? 'Directory' : 'File');
    const h = new Header({ path: m.path, type: type as never, size: type === 'File' ? body.length : 0, mode: m.mode ?? (type === 'Directory' ? 0o755 : 0o644), uid: m.uid ?? 0, gid: m.gid ?? 0, linkpath: m.linkpath, mtime: new Date(1_700_000_000_000) });
    // A name a ustar header cannot hold goes in a pax header before it.
    if (Buffer.byteLength(m.path) > 100) blocks.push(new Pax({ path: m.path } as never).encode());
    const block = Buffer.alloc(512);
    h.encode(block);
    blocks.push(block);
    if (type === 'File' && body.length > 0) blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

