import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { PassThrough, Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Parser, type ReadEntry } from 'tar';
import { BaseTarError, BaseTarRules, type TarLimits, type TarSummary, type Verdict } from './tarRules';

export { BaseTarError, type TarLimits, type TarSummary };

/**
 * Reads a tar stream (plain or gzip: node-tar tells them by their magic bytes) entry by entry,
 * one at a time and in order, through the import rules. `onEntry` gets each verdict with its
 * entry and must consume or drain its body. Any error (refused entry, damaged archive, the
 * input failing) ends the read and rejects; the input is destroyed.
 */
function walkTar(input: Readable, limits: TarLimits, onEntry: (v: Verdict, entry: ReadEntry, account: (n: number) => void) => Promise<void>): Promise<TarSummary> {
  const rules = new BaseTarRules(limits);
  // strict: a bad checksum, a truncated archive or a stray linkpath is an error, not a warning.
  const parser = new Parser({ strict: true, noResume: true });
  let chain = Promise.resolve();
  let failure: unknown = null;
  return new Promise<TarSummary>((resolve, reject) => {
    const fail = (e: unknown) => {
      if (failure !== null) return;
      failure = e;
      input.unpipe(parser);
      input.destroy();
      reject(e);
    };
    parser.on('entry', (entry: ReadEntry) => {
      chain = chain
        .then(async () => {
          if (failure !== null) return void entry.resume();
          await onEntry(rules.check(entry), entry, (n) => rules.account(n));
        })
        .catch((e) => {
          entry.resume();
          fail(e);
        });
    });
    // Entries node-tar would skip quietly (types it does not know, like GNU sparse files).
    parser.on('ignoredEntry', (entry: ReadEntry) => {
      if (!entry.meta) fail(new BaseTarError(`archive entry ${JSON.stringify(entry.path.slice(0, 200))} has type ${entry.type}, which a base cannot hold`, entry.path.slice(0, 200)));
    });
    // Past the end-of-archive marker nothing more is parsed (node-tar would keep buffering it),
    // and the parser is never written or ended again: 'eof' can come from inside its own gunzip's
    // write, which a parser.end() there would break. Every entry was queued before 'eof', so the
    // chain holds them all. The rest of the input is read and dropped, so a writer feeding it is
    // never held up.
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      void chain.then(() => failure === null && resolve(rules.summary));
    };
    parser.on('eof', () => {
      if (done || failure !== null) return;
      input.unpipe(parser);
      input.on('data', () => undefined);
      input.resume();
      finish();
    });
    parser.on('error', (e: Error) => {
      if (!done) fail(new BaseTarError(`not a valid tar archive: ${e.message}`, null));
    });
    parser.on('end', finish);
    input.on('error', fail);
    input.pipe(parser);
  });
}

export interface ScanResult extends TarSummary {
  /** Bytes of the stream as given (compressed or not). */
  bytes: number;
  /** sha256 (hex) of the stream as given. */
  sha256: string;
}

/** What each stream of the staging may hold (a megabyte). */
const STAGE_BUFFER = 1 << 20;

/**
 * Writes an upload to `file` while checking it: every entry through the import rules (bodies
 * read, not kept), its size against `maxBytes` (over it: BaseTarError `too_large`). On any
 * failure the file is removed.
 */
export async function stageTar(input: Readable, file: string, limits: TarLimits & { maxBytes: number }): Promise<ScanResult> {
  const hash = crypto.createHash('sha256');
  let bytes = 0;
  // Each stream may hold a megabyte: at Node's 16 KiB default every 64 KiB piece of the upload
  // paused the request once (docs/decisions.md "Files at stream speed").
  const scan = new PassThrough({ highWaterMark: STAGE_BUFFER });
  // Every chunk goes to the file and to the scan; the slower of the two sets the pace.
  const counted = new Transform({
    highWaterMark: STAGE_BUFFER,
    transform(chunk: Buffer, _enc, done) {
      bytes += chunk.length;
      if (bytes > limits.maxBytes) return done(new BaseTarError(`the upload is larger than ${limits.maxBytes} bytes`, null, 'too_large'));
      hash.update(chunk);
      if (scan.write(chunk)) done(null, chunk);
      else scan.once('drain', () => done(null, chunk));
    },
    flush(done) {
      scan.end();
      done();
    },
  });
  const out = fs.createWriteStream(file, { flags: 'wx', mode: 0o600, highWaterMark: STAGE_BUFFER });
  input.pipe(counted);
  input.once('error', (e) => counted.destroy(e));
  try {
    const [summary] = await Promise.all([
      walkTar(scan, limits, (_v, entry, account) => drain(entry, account)),
      pipeline(counted, out).catch((e) => {
        scan.destroy(e);
        throw e;
      }),
    ]);
    return { ...summary, bytes, sha256: hash.digest('hex') };
  } catch (e) {
    // What is left of the upload is the caller's (it answers, then closes the request).
    input.unpipe(counted);
    counted.destroy();
    out.destroy();
    // A refusal can come before the file is even open (the first entry is refused while the open
    // is under way on a loaded host): removed once the stream has closed, or the open made it
    // again after the removal, and the upload was left behind.
    if (!out.closed) await new Promise<void>((r) => out.once('close', () => r()));
    await fs.promises.rm(file, { force: true });
    throw e;
  }
}

/** Reads an entry's data to its end, counting it. */
async function drain(entry: ReadEntry, account: (n: number) => void): Promise<void> {
  for await (const chunk of entry) account((chunk as Buffer).length);
}

/**
 * Unpacks a base tarball into `root` (an empty directory the caller made for it: a new base's
 * dataset), acting only on what the rules allow. Nothing here follows a symlink: every parent is
 * a directory the archive made (the rules know), files are created with O_EXCL|O_NOFOLLOW, and
 * owners and times of links are set with lchown/lutimes. Directory modes, owners and times are
 * set last, deepest first, so a read-only directory in the archive does not stop its children.
 */
export async function extractTar(input: Readable, root: string, limits: TarLimits): Promise<TarSummary> {
  const dirs: { full: string; uid: number; gid: number; mode: number; mtime?: Date; depth: number }[] = [];
  const made = new Set<string>(['']);
  const at = (rel: string) => (rel === '' ? root : path.join(root, rel));
  // The parents not made yet, outermost first (the rules made sure none is a link or a file).
  const ensureParents = async (rel: string) => {
    const missing: string[] = [];
    for (let p = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : ''; !made.has(p); p = p.includes('/') ? p.slice(0, p.lastIndexOf('/')) : '') missing.push(p);
    for (const p of missing.reverse()) {
      await fs.promises.mkdir(at(p), { mode: 0o755 });
      made.add(p);
    }
  };

  const summary = await walkTar(input, limits, async (v, entry, account) => {
    if (v.action === 'drop') return drain(entry, account);
    const full = at(v.path);
    await ensureParents(v.path);
    switch (v.kind) {
      case 'dir':
        if (!made.has(v.path)) {
          await fs.promises.mkdir(full, { mode: 0o700 });
          made.add(v.path);
        }
        dirs.push({ full, uid: v.uid, gid: v.gid, mode: v.mode, mtime: v.mtime, depth: v.path === '' ? 0 : v.path.split('/').length });
        return drain(entry, account);
      case 'file': {
        const fh = await fs.promises.open(full, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
        try {
          for await (const chunk of entry) {
            account((chunk as Buffer).length);
            await fh.write(chunk as Buffer);
          }
          // chown before chmod: chown clears setuid/setgid bits.
          await fh.chown(v.uid, v.gid);
          await fh.chmod(v.mode);
          if (v.mtime) await fh.utimes(v.mtime, v.mtime);
        } finally {
          await fh.close();
        }
        return;
      }
      case 'symlink':
        await fs.promises.symlink(v.target!, full);
        await fs.promises.lchown(full, v.uid, v.gid);
        if (v.mtime) await fs.promises.lutimes(full, v.mtime, v.mtime);
        return drain(entry, account);
      case 'hardlink':
        await fs.promises.link(at(v.target!), full);
        return drain(entry, account);
    }
  });
  dirs.sort((a, b) => b.depth - a.depth);
  // Not synchronous: a base of many directories must not stall the node's event loop.
  for (const d of dirs) {
    await fs.promises.chown(d.full, d.uid, d.gid);
    await fs.promises.chmod(d.full, d.mode);
    if (d.mtime) await fs.promises.utimes(d.full, d.mtime, d.mtime);
  }
  return summary;
}
