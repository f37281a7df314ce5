/**
 * The sweep leaves a dir alone while the process that claimed it runs (test/helpers/owner.ts),
 * and removes it once that process is gone. The sweep runs for real here, without CI (so only a
 * dir untouched for an hour counts as stale: this test's own dir is aged by hand), over a temp
 * root of this test's own (`BOXHOST_SWEEP_ROOTS`), never the machine's temp dirs.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import t from 'tap';
import { claimDir, liveOwner } from './helpers/owner';

const SWEEP = path.join(__dirname, 'helpers', 'sweep.js');

t.test('claimDir and liveOwner', async (t) => {
  const dir = fs.mkdtempSync('/var/tmp/boxhost-unit-owner-');
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  t.equal(liveOwner(dir), null, 'an unclaimed dir has no owner');
  claimDir(dir);
  t.equal(liveOwner(dir), null, "this process's own claim does not stop itself");
  const child = spawn('sleep', ['60']);
  t.teardown(() => child.kill('SIGKILL'));
  const start = fs.readFileSync(`/proc/${child.pid}/stat`, 'utf8').split(') ')[1].split(' ')[19];
  fs.writeFileSync(path.join(dir, '.owner'), `${child.pid} ${start}\n`);
  t.equal(liveOwner(dir), child.pid, 'a running owner is named');
  fs.writeFileSync(path.join(dir, '.owner'), `${child.pid} ${Number(start) + 1}\n`);
  t.equal(liveOwner(dir), null, 'the same pid started at another time is not the owner');
  fs.writeFileSync(path.join(dir, '.owner'), 'garbage\n');
  t.equal(liveOwner(dir), null, 'an unreadable claim names no owner');
  const zombie = spawn('true');
  await new Promise((r) => zombie.once('exit', r)); // exited; reaped by libuv by now
  fs.writeFileSync(path.join(dir, '.owner'), `${zombie.pid} 1\n`);
  t.equal(liveOwner(dir), null, 'an owner that has ended names no owner');
});

t.test('the sweep leaves a live owner\'s test host dir alone, and removes it once the owner is gone', async (t) => {
  const root = fs.mkdtempSync('/var/tmp/boxhost-sweep-root-');
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  const dir = fs.mkdtempSync(path.join(root, 'bh-test-'));
  const child = spawn('sleep', ['60']);
  t.teardown(() => child.kill('SIGKILL'));
  const start = fs.readFileSync(`/proc/${child.pid}/stat`, 'utf8').split(') ')[1].split(' ')[19];
  fs.writeFileSync(path.join(dir, '.owner'), `${child.pid} ${start}\n`);
  const old = new Date(Date.now() - 2 * 3600_000);
  fs.utimesSync(dir, old, old); // stale by age: only its owner keeps it
  const env = { ...process.env, CI: '', BOXHOST_SWEEP_ROOTS: root };
  const first = spawnSync(process.execPath, [SWEEP], { encoding: 'utf8', env });
  t.match(first.stderr, `${dir} is in use by process ${child.pid}; left alone`, 'said why it was left');
  t.ok(fs.existsSync(dir), 'the dir of a running owner is still there');
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  fs.utimesSync(dir, old, old);
  const second = spawnSync(process.execPath, [SWEEP], { encoding: 'utf8', env });
  t.match(second.stderr, `an earlier run's test host ${dir} removed`, 'swept once its owner was gone');
  t.notOk(fs.existsSync(dir), 'and gone');
});
