import path from 'node:path';

/**
 * What a base tarball may hold (docs/bases.md "Import rules"). One set of rules, applied entry by
 * entry in archive order, by the scan of an upload (so a hostile archive is refused before it is
 * queued) and again by the extractor (which acts only on what they allow), through the same tar
 * parser: nothing is decided twice by two different readers of the format.
 *
 * The rules track every path the archive has made so far and its type, so they know, without
 * touching the disk, whether a parent is a real directory: an entry under a symlink (the "link
 * out, then write through it" attack) or under a file is refused, and so is a name made twice.
 */

/** Ids a box's user namespace maps (core/box.ts ID_RANGE_SIZE); an owner past them becomes nobody. */
const ID_LIMIT = 65_536;
const NOBODY = 65_534;
const MAX_PATH = 4096;
const MAX_SEGMENT = 255;
/** Directory levels a name may have (a Debian root goes ~15 deep). */
const MAX_DEPTH = 128;
/** What every entry costs besides its data (its inode, a symlink's target), counted against the
 *  unpacked bound so that millions of empty entries cannot fill a pool either. */
const ENTRY_COST = 512;
/** The names the rules keep in memory, together (bytes). */
const MAX_NAME_BYTES = 256 * 1024 * 1024;

/** Entries one base may hold at most (a Debian base has ~10 000). */
export const MAX_BASE_ENTRIES = 2_000_000;

export type EntryKind = 'dir' | 'file' | 'symlink' | 'hardlink';

/** What the rules allow an entry to become (`drop`: skipped, counted in the summary). */
export type Verdict =
  | { action: 'make'; kind: EntryKind; path: string; uid: number; gid: number; mode: number; mtime?: Date; size: number; target?: string }
  | { action: 'drop'; path: string; why: 'device' | 'fifo' };

/** An archive the rules refuse: `entry` names the offending member as the archive spells it. */
export class BaseTarError extends Error {
  override readonly name = 'BaseTarError';
  constructor(
    message: string,
    readonly entry: string | null,
    /** `too_large`: past the unpacked size or entry count bound (413); else refused (400). */
    readonly kind: 'refused' | 'too_large' = 'refused',
  ) {
    super(message);
  }
}

export interface TarLimits {
  /** The sum of file sizes the archive may unpack to. */
  maxUnpackedBytes: number;
  /** Entries (of any type) it may hold. */
  maxEntries: number;
}

export interface TarSummary {
  entries: number;
  unpackedBytes: number;
  /** Device nodes and FIFOs left out (runc gives every box its own /dev). */
  dropped: number;
  /** Files whose setuid/setgid bits were cleared (not root's, or writable by others). */
  setidCleared: number;
}

/** The fields of a tar entry the rules read (node-tar's ReadEntry has them). */
export interface TarEntryHeader {
  type: string;
  path: string;
  linkpath?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  size: number;
  mtime?: Date;
}

type Known = 'dir' | 'file' | 'other';

export class BaseTarRules {
  private readonly known = new Map<string, Known>([['', 'dir']]);
  readonly summary: TarSummary = { entries: 0, unpackedBytes: 0, dropped: 0, setidCleared: 0 };

  private nameBytes = 0;

  constructor(private readonly limits: TarLimits) {}

  /** Counts bytes an entry unpacks to (data as it is read, and each entry's own cost). */
  account(bytes: number): void {
    this.summary.unpackedBytes += bytes;
    if (this.summary.unpackedBytes > this.limits.maxUnpackedBytes) {
      throw new BaseTarError(`the archive unpacks to more than ${this.limits.maxUnpackedBytes} bytes`, null, 'too_large');
    }
  }

  private remember(p: string, t: Known): void {
    if (!this.known.has(p)) {
      this.nameBytes += p.length + 64;
      if (this.nameBytes > MAX_NAME_BYTES) throw new BaseTarError('the archive holds more names than a base import takes', null, 'too_large');
    }
    this.known.set(p, t);
  }

  /** The verdict on the next entry, or BaseTarError. */
  check(e: TarEntryHeader): Verdict {
    const shown = e.path;
    const refuse: (why: string) => never = (why) => {
      throw new BaseTarError(`archive entry ${JSON.stringify(shown.slice(0, 200))} ${why}`, shown.slice(0, 200));
    };
    if (++this.summary.entries > this.limits.maxEntries) {
      throw new BaseTarError(`the archive has more than ${this.limits.maxEntries} entries`, null, 'too_large');
    }
    const p = normalizeMember(e.path, refuse);
    const kind = kindOf(e.type);
    if (kind === null) refuse(`has type ${e.type}, which a base cannot hold`);
    if (kind === 'device' || kind === 'fifo') {
      this.summary.dropped++;
      return { action: 'drop', path: p, why: kind };
    }

    // Every parent must be a directory the archive made (or one made for it on the way). Only
    // the parents not known yet are looked at: each is added once, so an archive of deep names
    // costs what its names weigh, not their depth squared.
    if (p !== '' && p.split('/').length > MAX_DEPTH) refuse(`is more than ${MAX_DEPTH} directories deep`);
    const missing: string[] = [];
    for (let parent = parentOf(p); parent !== null; parent = parentOf(parent)) {
      const t = this.known.get(parent);
      if (t === undefined) {
        missing.push(parent);
        continue;
      }
      if (t !== 'dir') refuse(`is inside ${JSON.stringify(parent)}, which the archive made a ${t === 'file' ? 'file' : 'link'}: it would be written through it`);
      break;
    }
    for (const m of missing) this.remember(m, 'dir');
    const before = this.known.get(p);
    if (before !== undefined && !(before === 'dir' && kind === 'dir')) refuse(p === '' ? 'names the root as something other than a directory' : 'appears twice in the archive');
    if (p === '' && kind !== 'dir') refuse('names the root as something other than a directory');

    let target: string | undefined;
    if (kind === 'symlink') {
      target = e.linkpath ?? '';
      if (target === '' || target.includes('\0') || target.length > MAX_PATH) refuse('is a symlink with an empty or invalid target');
      // An absolute target resolves inside the box (its root is the box's /); a relative one
      // must not climb above the root.
      if (!target.startsWith('/') && escapes(path.posix.dirname(`/${p}`), target)) refuse(`is a symlink to ${JSON.stringify(target.slice(0, 200))}, outside the base's root`);
    } else if (kind === 'hardlink') {
      const linked = normalizeMember(e.linkpath ?? '', () => refuse(`is a hard link to ${JSON.stringify((e.linkpath ?? '').slice(0, 200))}, outside the base's root`));
      if (this.known.get(linked) !== 'file') refuse(`is a hard link to ${JSON.stringify(linked)}, which is not a file made earlier in the archive`);
      target = linked;
    }

    // What the header says; the bytes really read are counted too (`account`): a pax header
    // can make the two differ.
    const size = kind === 'file' ? Math.max(0, e.size) : 0;
    this.account(ENTRY_COST);
    this.remember(p, kind === 'dir' ? 'dir' : kind === 'file' || kind === 'hardlink' ? 'file' : 'other');

    const uid = ownerId(e.uid);
    const gid = ownerId(e.gid);
    let mode = (e.mode ?? (kind === 'dir' ? 0o755 : 0o644)) & 0o7777;
    // setuid/setgid are kept only where a distribution puts them: root's files that no one else
    // can write (su, passwd, mount…). Box roots are mounted nosuid anyway (docs/security.md).
    if ((kind === 'file' || kind === 'hardlink') && mode & 0o6000 && (uid !== 0 || mode & 0o022)) {
      mode &= ~0o6000;
      this.summary.setidCleared++;
    }
    return { action: 'make', kind, path: p, uid, gid, mode, mtime: e.mtime, size, target };
  }
}

/**
 * A member name as a path relative to the root (`''` for the root itself): `./` prefixes and
 * trailing slashes go; absolute names, `..` segments, NUL and over-long names are refused.
 */
function normalizeMember(raw: string, refuse: (why: string) => never): string {
  if (raw.includes('\0')) refuse('has a NUL in its name');
  if (Buffer.byteLength(raw) > MAX_PATH) refuse(`has a name longer than ${MAX_PATH} bytes`);
  if (raw.startsWith('/')) refuse('has an absolute path');
  const segments = raw.split('/').filter((s) => s !== '' && s !== '.');
  if (segments.includes('..')) refuse('has a ".." segment');
  if (segments.some((s) => Buffer.byteLength(s) > MAX_SEGMENT)) refuse(`has a name segment longer than ${MAX_SEGMENT} bytes`);
  return segments.join('/');
}

/** The parent of a root-relative path (`''` for a top-level name, null for the root). */
const parentOf = (p: string): string | null => (p === '' ? null : p.includes('/') ? p.slice(0, p.lastIndexOf('/')) : '');

/** Whether `target`, read from the directory `from` (absolute, inside the root), climbs above it. */
function escapes(from: string, target: string): boolean {
  let depth = from.split('/').filter(Boolean).length;
  for (const s of target.split('/')) {
    if (s === '' || s === '.') continue;
    if (s === '..') {
      if (--depth < 0) return true;
    } else depth++;
  }
  return false;
}

const ownerId = (id: number | undefined) => (id === undefined || !Number.isInteger(id) || id < 0 ? 0 : id >= ID_LIMIT ? NOBODY : id);

function kindOf(type: string): EntryKind | 'device' | 'fifo' | null {
  switch (type) {
    case 'File':
    case 'OldFile':
    case 'ContiguousFile':
      return 'file';
    case 'Directory':
      return 'dir';
    case 'SymbolicLink':
      return 'symlink';
    case 'Link':
      return 'hardlink';
    case 'CharacterDevice':
    case 'BlockDevice':
      return 'device';
    case 'FIFO':
      return 'fifo';
    default:
      return null;
  }
}
