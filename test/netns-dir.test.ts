/**
 * /run/netns as its own shared mount (workers/runtime/netnsDir.ts), on scratch directories of the
 * real host: made once, never stacked, and a directory that already holds netns-like mounts is
 * left alone (binding it would hide them: the "Device or resource busy" leftovers of a freshly
 * booted machine).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { run } from '../core/command';
import { ensureNetnsDir } from '../workers/runtime/netnsDir';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-netnsdir-'));
const mountsAt = (p: string) =>
  fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.split(' ')[4] === p);
t.teardown(async () => {
  for (let i = 0; i < 4; i++) for (const d of [path.join(root, 'held', 'ns1'), path.join(root, 'fresh'), path.join(root, 'held')]) await run(['umount', d], { allowFailure: true });
  fs.rmSync(root, { recursive: true, force: true });
});

t.test('a plain directory becomes its own shared mount, once', async (t) => {
  const dir = path.join(root, 'fresh');
  t.equal(mountsAt(dir).length, 0, 'not a mount before');
  await ensureNetnsDir(dir);
  await ensureNetnsDir(dir);
  const m = mountsAt(dir);
  t.equal(m.length, 1, 'one mount, not stacked');
  t.match(m[0], / shared:\d+ /, 'with shared propagation');
  // A namespace-like mount made in it now is reachable and removable.
  fs.writeFileSync(path.join(dir, 'ns'), '');
  await run(['mount', '--bind', '/proc/self/ns/net', path.join(dir, 'ns')]);
  await run(['umount', path.join(dir, 'ns')]);
  fs.rmSync(path.join(dir, 'ns'));
  t.notOk(fs.existsSync(path.join(dir, 'ns')), 'a netns mounted in it goes away');
});

t.test('a directory that already holds mounts is left as it is', async (t) => {
  const dir = path.join(root, 'held');
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'ns1'), '');
  await run(['mount', '--bind', '/proc/self/ns/net', path.join(dir, 'ns1')]);
  const warned: string[] = [];
  await ensureNetnsDir(dir, (m) => warned.push(m));
  t.equal(mountsAt(dir).length, 0, 'not bound over (that would hide ns1)');
  t.match(warned.join(''), /already holds network namespaces/);
  await run(['umount', path.join(dir, 'ns1')]);
  fs.rmSync(path.join(dir, 'ns1'));
  t.notOk(fs.existsSync(path.join(dir, 'ns1')), 'and what it held can still be removed');
});
