import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { Readable } from 'node:stream';
import { archive, type Member } from './helpers/tarball';
import t from 'tap';
import { BaseTarError, extractTar, stageTar } from '../workers/bases/tarImport';
import { packBase } from '../workers/bases/tarExport';

/**
 * The base import rules and the extractor on crafted archives (docs/bases.md "Import rules"):
 * every hostile shape is refused by the scan and by the extractor alike, and leaves nothing
 * outside the target; what a real root holds (links, owners, setuid root files) comes through.
 * Runs as root in a temporary directory: no ZFS needed.
 */

const limits = { maxUnpackedBytes: 1 << 20, maxEntries: 1000, maxBytes: 1 << 20 };
const scratch = (t: { teardown(fn: () => void): void }) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-tar-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const root = path.join(dir, 'root');
  fs.mkdirSync(root);
  return { dir, root };
};

const refusal = async (p: Promise<unknown>): Promise<BaseTarError> => {
  try {
    await p;
  } catch (e) {
    if (e instanceof BaseTarError) return e;
    throw e;
  }
  throw new Error('expected the archive to be refused');
};

const hostile: [string, Member[], RegExp][] = [
  ['absolute path', [{ path: '/etc/passwd', body: 'x' }], /absolute path/],
  ['.. segment', [{ path: '../../escape', body: 'x' }], /"\.\." segment/],
  ['.. inside a path', [{ path: 'etc/../../escape', body: 'x' }], /"\.\." segment/],
  ['symlink out, then write through it', [{ path: 'out', type: 'SymbolicLink', linkpath: '/tmp' }, { path: 'out/pwned', body: 'x' }], /written through/],
  ['relative symlink climbing out', [{ path: 'a/', type: 'Directory' }, { path: 'a/up', type: 'SymbolicLink', linkpath: '../../..' }], /outside the base's root/],
  ['hard link to a host file', [{ path: 'shadow', type: 'Link', linkpath: '/etc/shadow' }], /hard link/],
  ['hard link climbing out', [{ path: 'x', type: 'Link', linkpath: '../x' }], /hard link/],
  ['hard link to something not in the archive', [{ path: 'x', type: 'Link', linkpath: 'etc/passwd' }], /not a file made earlier/],
  ['file then a file under it', [{ path: 'f', body: 'x' }, { path: 'f/g', body: 'y' }], /written through/],
  ['a name twice', [{ path: 'f', body: 'x' }, { path: 'f', type: 'SymbolicLink', linkpath: '/etc' }], /appears twice/],
];

t.test('hostile archives are refused by the scan and by the extractor, and leave nothing', async (t) => {
  for (const [what, members, why] of hostile) {
    const { dir, root } = scratch(t);
    const tarball = archive(members);
    const staged = path.join(dir, 'upload.tar');
    const e1 = await refusal(stageTar(Readable.from([tarball]), staged, limits));
    t.match(e1.message, why, `${what}: scan refuses (${e1.message})`);
    t.equal(e1.kind, 'refused');
    t.notOk(fs.existsSync(staged), `${what}: the staged upload is removed`);
    const e2 = await refusal(extractTar(Readable.from([tarball]), root, limits));
    t.match(e2.message, why, `${what}: the extractor refuses too`);
    t.notOk(fs.existsSync('/tmp/pwned'), `${what}: nothing written through a link`);
    t.notOk(fs.existsSync(path.join(dir, 'escape')), `${what}: nothing written above the root`);
  }
});

t.test('size bounds: the upload, the unpacked size, the entry count', async (t) => {
  const { dir } = scratch(t);
  const big = archive([{ path: 'big', body: 'x'.repeat(4096) }]);
  const e1 = await refusal(stageTar(Readable.from([big]), path.join(dir, 'a.tar'), { ...limits, maxBytes: 2048 }));
  t.equal(e1.kind, 'too_large');
  t.match(e1.message, /larger than 2048 bytes/);
  const e2 = await refusal(stageTar(Readable.from([big]), path.join(dir, 'b.tar'), { ...limits, maxUnpackedBytes: 1000 }));
  t.equal(e2.kind, 'too_large');
  t.match(e2.message, /unpacks to more than 1000 bytes/);
  // A gzip bomb is bounded by what it unpacks to, not by what was uploaded.
  const bomb = zlib.gzipSync(archive([{ path: 'zeros', body: '\0'.repeat(200_000) }]));
  t.ok(bomb.length < 2048, 'the bomb is small');
  const e3 = await refusal(stageTar(Readable.from([bomb]), path.join(dir, 'c.tar'), { ...limits, maxBytes: 2048, maxUnpackedBytes: 100_000 }));
  t.equal(e3.kind, 'too_large');
  const many = archive(Array.from({ length: 20 }, (_, i) => ({ path: `f${i}`, body: '' })));
  const e4 = await refusal(stageTar(Readable.from([many]), path.join(dir, 'd.tar'), { ...limits, maxEntries: 10 }));
  t.equal(e4.kind, 'too_large');
  t.same(fs.readdirSync(dir).filter((n) => n.endsWith('.tar')), [], 'no staged file is left');
  const e5 = await refusal(stageTar(Readable.from([Buffer.from('this is not a tarball at all, not even close'.repeat(20))]), path.join(dir, 'e.tar'), limits));
  t.match(e5.message, /not a valid tar archive|type/);
});

t.test('a root filesystem comes through: links, owners, modes; devices dropped; setuid kept only where safe', async (t) => {
  const { dir, root } = scratch(t);
  const members: Member[] = [
    { path: './', type: 'Directory', mode: 0o755 },
    { path: 'usr/bin/', type: 'Directory' },
    { path: 'usr/bin/su', body: '#!/bin/sh\n', mode: 0o4755 },
    { path: 'usr/bin/evil', body: 'x', mode: 0o4777 },
    { path: 'home/box/', type: 'Directory', uid: 1000, gid: 1000, mode: 0o700 },
    { path: 'home/box/own', body: 'mine', uid: 1000, gid: 1000, mode: 0o4755 },
    { path: 'home/box/ro/', type: 'Directory', mode: 0o555, uid: 1000, gid: 1000 },
    { path: 'home/box/ro/inside', body: 'in a read-only dir', uid: 1000, gid: 1000 },
    { path: 'bin', type: 'SymbolicLink', linkpath: 'usr/bin' },
    { path: 'etc/mtab', type: 'SymbolicLink', linkpath: '/proc/self/mounts' },
    { path: 'etc/up', type: 'SymbolicLink', linkpath: '../usr/bin' },
    { path: 'usr/bin/su2', type: 'Link', linkpath: 'usr/bin/su' },
    { path: 'dev/null', type: 'CharacterDevice' },
    { path: 'run/fifo', type: 'FIFO' },
    { path: 'far', body: 'x', uid: 200_000, gid: 200_000 },
  ];
  const tarball = zlib.gzipSync(archive(members));
  const staged = path.join(dir, 'upload.tgz');
  const scanned = await stageTar(Readable.from([tarball]), staged, limits);
  t.equal(scanned.bytes, tarball.length);
  t.equal(scanned.dropped, 2, 'the device node and the fifo are dropped');
  t.equal(scanned.setidCleared, 2, 'setuid cleared on a world-writable root file and a user file');
  const summary = await extractTar(fs.createReadStream(staged), root, limits);
  t.same(summary, { entries: scanned.entries, unpackedBytes: scanned.unpackedBytes, dropped: 2, setidCleared: 2 }, 'the extractor agrees with the scan');
  const st = (p: string) => fs.lstatSync(path.join(root, p));
  t.equal(st('usr/bin/su').mode & 0o7777, 0o4755, 'root setuid file kept');
  t.equal(st('usr/bin/evil').mode & 0o7777, 0o0777, 'world-writable setuid cleared');
  t.equal(st('home/box/own').mode & 0o7777, 0o0755, "a user's setuid cleared");
  t.equal(st('home/box/own').uid, 1000);
  t.equal(st('home/box').mode & 0o777, 0o700);
  t.equal(st('home/box/ro').mode & 0o777, 0o555, 'a read-only directory is read-only, and its file is in it');
  t.equal(fs.readFileSync(path.join(root, 'home/box/ro/inside'), 'utf8'), 'in a read-only dir');
  t.equal(fs.readlinkSync(path.join(root, 'bin')), 'usr/bin');
  t.equal(fs.readlinkSync(path.join(root, 'etc/mtab')), '/proc/self/mounts', 'an absolute symlink is kept (it resolves in the box)');
  t.equal(st('usr/bin/su2').ino, st('usr/bin/su').ino, 'hard link');
  t.notOk(fs.existsSync(path.join(root, 'dev/null')));
  t.equal(st('far').uid, 65534, 'an owner past the box id range becomes nobody');

  // Export and import again: the same tree.
  const exported = await new Promise<Buffer>(async (resolve, reject) => {
    const chunks: Buffer[] = [];
    (await packBase(root)).on('data', (c: Buffer) => chunks.push(c)).on('end', () => resolve(Buffer.concat(chunks))).on('error', reject);
  });
  const again = path.join(dir, 'again');
  fs.mkdirSync(again);
  await extractTar(Readable.from([exported]), again, limits);
  for (const p of ['usr/bin/su', 'home/box/own', 'home/box/ro/inside', 'bin', 'etc/mtab', 'usr/bin/su2', 'far']) {
    const a = st(p);
    const b = fs.lstatSync(path.join(again, p));
    t.same([b.mode, b.uid, b.gid, b.size], [a.mode, a.uid, a.gid, a.size], `${p} round-trips`);
  }
  t.equal(fs.lstatSync(path.join(again, 'usr/bin/su2')).ino, fs.lstatSync(path.join(again, 'usr/bin/su')).ino, 'the hard link round-trips');
});

t.test('review findings: export takes names as paths, deep names are cheap or refused, nothing after the end is parsed', async (t) => {
  const { dir, root } = scratch(t);
  // `@x` must not make the export read the file `x` points to as an archive to append.
  fs.writeFileSync(path.join(root, '@x'), '');
  fs.symlinkSync('/etc/hostname', path.join(root, 'x'));
  const exported = await new Promise<Buffer>(async (resolve, reject) => {
    const chunks: Buffer[] = [];
    (await packBase(root)).on('data', (c: Buffer) => chunks.push(c)).on('end', () => resolve(Buffer.concat(chunks))).on('error', reject);
  });
  const names: string[] = [];
  const out = path.join(dir, 'out');
  fs.mkdirSync(out);
  await extractTar(Readable.from([exported]), out, limits);
  for (const n of fs.readdirSync(out).sort()) names.push(`${n}:${fs.lstatSync(path.join(out, n)).isSymbolicLink() ? 'link' : 'file'}`);
  t.same(names, ['@x:file', 'x:link'], 'the two names, as they are');
  // An empty base exports as an archive that imports again.
  const empty = path.join(dir, 'empty');
  fs.mkdirSync(empty);
  const chunks: Buffer[] = [];
  for await (const c of await packBase(empty)) chunks.push(c as Buffer);
  const back = path.join(dir, 'back');
  fs.mkdirSync(back);
  t.ok((await extractTar(Readable.from([Buffer.concat(chunks)]), back, limits)).entries >= 1, 'an empty base round-trips');

  // 2000 names 100 levels deep under distinct tops: each parent is looked at once.
  const deep = Array.from({ length: 2000 }, (_, i) => ({ path: `${'d'.repeat(1)}${i}/${Array(99).fill('a').join('/')}/f`, body: '' }));
  const scanned = await stageTar(Readable.from([archive(deep)]), path.join(dir, 'deep.tar'), { ...limits, maxBytes: 64 << 20, maxEntries: 10_000, maxUnpackedBytes: 1 << 30 });
  t.equal(scanned.entries, 2000);
  const tooDeep = await refusal(stageTar(Readable.from([archive([{ path: `${Array(130).fill('a').join('/')}/f`, body: '' }])]), path.join(dir, 'd2.tar'), limits));
  t.match(tooDeep.message, /directories deep/);

  // Junk after the end-of-archive marker is kept in the upload (it is hashed) but never parsed.
  const junk = Buffer.concat([archive([{ path: 'f', body: 'x' }]), Buffer.alloc(5 << 20, 7)]);
  const withJunk = await stageTar(Readable.from([junk]), path.join(dir, 'junk.tar'), { ...limits, maxBytes: 10 << 20 });
  t.equal(withJunk.bytes, junk.length);
  t.equal(withJunk.entries, 1);
});

t.test('gzip in any chunking: the end-of-archive marker inside a gzip write neither crashes nor refuses', async (t) => {
  const { dir, root } = scratch(t);
  fs.mkdirSync(path.join(root, 'etc'));
  for (let i = 0; i < 40; i++) fs.writeFileSync(path.join(root, 'etc', `f${i}`), `file ${i}\n`.repeat(i * 10));
  const { execFileSync } = await import('node:child_process');
  const tgz = execFileSync('tar', ['-C', root, '-b', '2048', '-czf', '-', '.']);
  const split = (b: Buffer, n: number) => Array.from({ length: Math.ceil(b.length / n) }, (_, i) => b.subarray(i * n, (i + 1) * n));
  for (const size of [50, 512, 1448, 8192]) {
    const scanned = await stageTar(Readable.from(split(tgz, size)), path.join(dir, `c${size}.tgz`), limits);
    t.equal(scanned.entries, 42, `scanned in ${size}-byte chunks`);
    const out = path.join(dir, `x${size}`);
    fs.mkdirSync(out);
    t.equal((await extractTar(Readable.from(split(tgz, size)), out, limits)).entries, 42, `unpacked in ${size}-byte chunks`);
  }
  // A gzip stream flushed right after the marker, then a long tail, in two writes.
  const gz = zlib.createGzip();
  const parts: Buffer[] = [];
  gz.on('data', (c: Buffer) => parts.push(c));
  gz.write(archive([{ path: 'f', body: 'x' }]));
  await new Promise<void>((r) => gz.flush(zlib.constants.Z_SYNC_FLUSH, () => r()));
  const head = Buffer.concat(parts.splice(0));
  gz.end(Buffer.alloc(64 * 1024));
  await new Promise((r) => gz.on('end', r));
  const tail = Buffer.concat(parts);
  const scanned = await stageTar(Readable.from([head, tail]), path.join(dir, 'flushed.tgz'), limits);
  t.equal(scanned.entries, 1);
  t.equal(scanned.bytes, head.length + tail.length);
});

t.test('an export whose reader goes away leaves no file of the base open', async (t) => {
  const { root } = scratch(t);
  for (let i = 0; i < 4; i++) fs.writeFileSync(path.join(root, `big${i}`), crypto.randomBytes(8 << 20));
  const openUnderRoot = () =>
    fs.readdirSync('/proc/self/fd').map((f) => {
      try {
        return fs.readlinkSync(`/proc/self/fd/${f}`);
      } catch {
        return '';
      }
    }).filter((p) => p.startsWith(`${root}/`));
  for (const cut of [1 << 20, 9 << 20, 20 << 20]) {
    const s = await packBase(root);
    let n = 0;
    await new Promise<void>((resolve) => s.on('data', (c: Buffer) => {
      n += c.length;
      if (n > cut) {
        s.pause();
        resolve();
      }
    }));
    t.ok(openUnderRoot().length > 0 || cut > 16 << 20, 'a file was being read');
    s.destroy();
    await new Promise((r) => setTimeout(r, 200));
    t.same(openUnderRoot(), [], `cut after ${cut >> 20} MiB: nothing left open`);
  }
  // And one read to its end: the four files, whole.
  const chunks: Buffer[] = [];
  for await (const c of await packBase(root)) chunks.push(c as Buffer);
  t.ok(Buffer.concat(chunks).length > 32 << 20);
  t.same(openUnderRoot(), []);
});

t.test('an export keeps a mode of 0 (as /etc/shadow has in some distributions)', async (t) => {
  const { dir, root } = scratch(t);
  fs.mkdirSync(path.join(root, 'etc'));
  fs.writeFileSync(path.join(root, 'etc/shadow'), 'root:*:1::::::\n');
  fs.chmodSync(path.join(root, 'etc/shadow'), 0);
  fs.mkdirSync(path.join(root, 'locked'));
  fs.chmodSync(path.join(root, 'locked'), 0);
  const chunks: Buffer[] = [];
  for await (const c of await packBase(root)) chunks.push(c as Buffer);
  fs.chmodSync(path.join(root, 'locked'), 0o755);
  const out = path.join(dir, 'out');
  fs.mkdirSync(out);
  await extractTar(Readable.from([Buffer.concat(chunks)]), out, limits);
  t.equal(fs.statSync(path.join(out, 'etc/shadow')).mode & 0o7777, 0);
  t.equal(fs.statSync(path.join(out, 'locked')).mode & 0o7777, 0);
  fs.chmodSync(path.join(out, 'locked'), 0o755);
});
