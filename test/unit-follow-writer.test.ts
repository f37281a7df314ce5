/**
 * FollowWriter (workers/storage/followWriter.ts), which hashes a backup stream while `zfs send`
 * writes it: another process writes the file through its own descriptor, in bursts with pauses
 * and in one fast run; the sha256 and size answered are the finished file's, byte for byte.
 */
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { FollowWriter, removeParts } from '../workers/storage/followWriter';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-follow-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));

/** Runs `script` (sh) with its stdout on the file, as the backup runs `zfs send`. */
async function followed(name: string, script: string): Promise<{ got: { bytes: number; sha256: string }; file: string }> {
  const file = path.join(dir, name);
  const out = await fs.promises.open(file, 'w', 0o600);
  const follower = new FollowWriter(file, out);
  const child = spawn('sh', ['-c', script], { stdio: ['ignore', out.fd, 'inherit'] });
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  if (code !== 0) throw new Error(`writer exited ${code}`);
  const got = await follower.finish();
  await out.close();
  return { got, file };
}

const sha256Of = (file: string) => crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');

t.test('bursts with pauses between them: every byte hashed once, in order', async (t) => {
  const { got, file } = await followed('bursts', 'for i in 1 2 3 4 5 6; do head -c 3000001 /dev/urandom; sleep 0.05; done');
  t.equal(got.bytes, 6 * 3000001);
  t.equal(got.bytes, fs.statSync(file).size);
  t.equal(got.sha256, sha256Of(file));
});

t.test('a fast writer of 80 MiB (past two flushes)', async (t) => {
  const { got, file } = await followed('fast', 'head -c 83886080 /dev/urandom');
  t.equal(got.bytes, 80 * 1024 * 1024);
  t.equal(got.sha256, sha256Of(file));
});

t.test('an empty stream', async (t) => {
  const { got } = await followed('empty', 'true');
  t.same(got, { bytes: 0, sha256: crypto.createHash('sha256').digest('hex') });
});

t.test('abandoned when the writer failed: it stops following', async (t) => {
  const file = path.join(dir, 'failed');
  const out = await fs.promises.open(file, 'w', 0o600);
  const follower = new FollowWriter(file, out);
  await out.write(Buffer.alloc(1000));
  for (let i = 0; i < 200 && follower.bytes < 1000; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(follower.bytes, 1000, 'it follows the file while it is written');
  await follower.abandon();
  await out.write(Buffer.alloc(500));
  await new Promise((r) => setTimeout(r, 50));
  await out.close();
  t.equal(follower.bytes, 1000, 'and reads nothing after it was abandoned');
});

t.test("removeParts: every attempt's .part of one stream, nothing else", async (t) => {
  const d = fs.mkdtempSync(path.join(dir, 'parts-'));
  for (const n of ['b.zfs', 'b.zfs.part', 'b.zfs.part-0a1b2c', 'b.zfs.part-ffeedd', 'b.json', 'c.zfs.part-0a1b2c']) fs.writeFileSync(path.join(d, n), 'x');
  await removeParts(path.join(d, 'b.zfs'));
  t.same(fs.readdirSync(d).sort(), ['b.json', 'b.zfs', 'c.zfs.part-0a1b2c']);
  await removeParts(path.join(d, 'missing-dir', 'x.zfs'));
  t.pass('a directory that is not there is nothing to remove');
});
