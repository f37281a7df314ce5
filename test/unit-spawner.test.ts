/**
 * Host commands through the spawner (core/spawner.ts): the same answers as a command started
 * here (output, input, exit codes, a missing binary, the timeout), a process whose event loop
 * is not held by the forks, and a helper that never keeps its parent alive.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { CommandError, isLockTimeout, run } from '../core/command';
import { makePrivate, remountPrivate, spawnCollect, SPAWNER_BIN, useSpawner } from '../core/spawner';

for (const on of [false, true]) {
  t.test(`run() ${on ? 'through the spawner' : 'started here'}`, async (t) => {
    useSpawner(on);
    t.teardown(() => useSpawner(false));
    const outs = await Promise.all(Array.from({ length: 20 }, (_, i) => run(['sh', '-c', 'echo "$0"; echo err >&2', String(i)])));
    t.same(outs.map((o) => o.stdout), Array.from({ length: 20 }, (_, i) => `${i}\n`), 'each answer is its own command\'s stdout');
    t.ok(outs.every((o) => o.stderr === 'err\n' && o.exitCode === 0), 'stderr and exit code');
    t.equal((await run(['cat'], { input: 'hello' })).stdout, 'hello', 'input reaches stdin');
    t.equal((await run(['cat'], { input: Buffer.from([1, 2, 3]) })).stdout, '\u0001\u0002\u0003', 'a Buffer input too');
    t.equal((await run(['sh', '-c', 'exit 3'], { allowFailure: true })).exitCode, 3, 'allowFailure answers the exit code');
    const failed = await run(['sh', '-c', 'echo why >&2; exit 1']).catch((e) => e);
    t.ok(failed instanceof CommandError && failed.exitCode === 1 && /why/.test(failed.message), 'a failure throws a CommandError with stderr');
    const missing = await run(['/nonexistent/binary']).catch((e) => e);
    t.equal(missing.code, 'ENOENT', 'a missing binary rejects with ENOENT');
    const t0 = Date.now();
    t.equal((await run(['sleep', '5'], { timeoutMs: 200, allowFailure: true })).exitCode, null, 'killed at its timeout: no exit code');
    t.ok(Date.now() - t0 < 4000, 'the timeout ended it');
    t.equal((await run(['sh', '-c', 'echo "$X"'], { env: { X: 'given', PATH: process.env.PATH } })).stdout, 'given\n', 'the env given');
    // Larger than the helper's 64 MB heap would hold as text, with a multibyte character at the end.
    const big = await run(['sh', '-c', "head -c 48000000 /dev/zero | tr '\\0' a; printf 'é'"]);
    t.equal(big.stdout.length, 48_000_001, 'a 48 MB output arrives whole');
    t.ok(big.stdout.endsWith('aé'), 'and decoded as UTF-8');
    const spawnFailed = await run(['/nonexistent/binary']).catch((e) => e);
    t.match(spawnFailed, { code: 'ENOENT', syscall: 'spawn /nonexistent/binary', path: '/nonexistent/binary' }, 'a spawn error keeps its fields');
  });
}

for (const on of [false, true]) {
  t.test(`run() with a lock file ${on ? 'through the spawner' : 'started here'}: commands take turns, across processes`, async (t) => {
    useSpawner(on);
    t.teardown(() => useSpawner(false));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-lock-'));
    t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
    const lockFile = path.join(dir, 'lock');
    const log = path.join(dir, 'log');
    // Each writes "<i>{" then, a while later, "}": with the lock no two are ever inside at once.
    const step = (i: number) => run(['sh', '-c', 'printf "$0{" >> "$1"; sleep 0.05; printf "}" >> "$1"', String(i), log], { lockFile });
    await Promise.all(Array.from({ length: 6 }, (_, i) => step(i)));
    t.match(fs.readFileSync(log, 'utf8'), /^(\d\{\}){6}$/, `one at a time: ${fs.readFileSync(log, 'utf8')}`);
    // Positive control: without the lock the same commands overlap.
    fs.writeFileSync(log, '');
    await Promise.all(Array.from({ length: 6 }, (_, i) => run(['sh', '-c', 'printf "$0{" >> "$1"; sleep 0.05; printf "}" >> "$1"', String(i), log])));
    t.notMatch(fs.readFileSync(log, 'utf8'), /^(\d\{\}){6}$/, `without it they overlap: ${fs.readFileSync(log, 'utf8')}`);
    // Held by another process (flock(1), as another node or test host would): the command waits
    // for it, and one whose deadline passes first never starts.
    const holder = spawn('flock', [lockFile, 'sleep', '30'], { stdio: 'ignore', detached: true });
    const letGo = () => {
      try {
        process.kill(-holder.pid!, 'SIGKILL'); // flock and its sleep, which holds the lock too
      } catch {
        // gone already
      }
    };
    t.teardown(letGo);
    while (spawnSync('flock', ['-n', lockFile, 'true']).status === 0) await new Promise((r) => setTimeout(r, 10));
    const waited = await run(['sh', '-c', 'touch "$0"', path.join(dir, 'started')], { lockFile, timeoutMs: 400, allowFailure: true }).catch((e) => e);
    t.ok(isLockTimeout(waited), `its deadline passed while another process held the lock: a lock timeout, not a kill (${waited?.message})`);
    t.notOk(fs.existsSync(path.join(dir, 'started')), 'and it never started');
    const later = run(['sh', '-c', 'echo ran'], { lockFile, timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 100));
    letGo();
    t.equal((await later).stdout, 'ran\n', 'one that waits runs once the other process lets go');
    t.equal((await run(['true'], { lockFile, timeoutMs: 2000 })).exitCode, 0, 'and the lock is free again after a timed-out wait');
    // A command killed at its deadline dies with its lock's holder: it never runs on unlocked.
    const pidFile = path.join(dir, 'pid');
    const killed = await run(['sh', '-c', 'echo $$ > "$0"; exec sleep 30', pidFile], { lockFile, timeoutMs: 500, allowFailure: true });
    t.equal(killed.exitCode, null, 'killed at its deadline');
    const pid = Number(fs.readFileSync(pidFile, 'utf8'));
    // Gone, or dead and not yet reaped (a zombie: without flock, its parent, init reaps it).
    const running = () => {
      try {
        return fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0] !== 'Z';
      } catch {
        return false;
      }
    };
    let alive = true;
    for (let i = 0; i < 100 && (alive = running()); i++) await new Promise((r) => setTimeout(r, 10));
    t.notOk(alive, 'the command itself is gone too');
  });
}

t.test('a process that used the spawner exits by itself when its work is done', async (t) => {
  const script = `const { run } = require(${JSON.stringify(path.join(__dirname, '../core/command'))});
    require(${JSON.stringify(path.join(__dirname, '../core/spawner'))}).useSpawner();
    run(['echo', 'done']).then((r) => process.stdout.write(r.stdout));`;
  const r = spawnSync(process.execPath, ['-e', script], { timeout: 20_000, encoding: 'utf8' });
  t.equal(r.status, 0, 'exited 0 (not killed at the 20 s timeout)');
  t.equal(r.stdout, 'done\n', 'after the command answered');
});

t.test('a command without stdio is answered at its exit, even with a process left holding what it had', async (t) => {
  useSpawner(true);
  t.teardown(() => useSpawner(false));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const t0 = Date.now();
  // As `runc run --detach` leaves the container: a child that outlives it. With pipes, the
  // answer would wait for the child.
  const answer = spawnCollect(['sh', '-c', 'pwd > marker; sleep 5 & exit 3'], { cwd: dir, noStdio: true });
  t.ok(answer, 'the helper takes it');
  t.equal((await answer!).exitCode, 3, 'its exit code');
  t.ok(Date.now() - t0 < 4000, 'without waiting for the process it left');
  t.equal(fs.readFileSync(path.join(dir, 'marker'), 'utf8'), `${fs.realpathSync(dir)}\n`, 'in the cwd given');
});

t.test("the helper's own work: boxd listen in its process, a nosuid,nodev remount", async (t) => {
  useSpawner(true);
  t.teardown(() => useSpawner(false));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  // `boxd listen SOCKET PROGRAM…`: PROGRAM gets the listening socket as fd 3 (a socket the
  // helper made, root's only), and its exit code is the answer.
  const sock = path.join(dir, 'b.sock');
  const r = await run([SPAWNER_BIN, 'listen', sock, 'sh', '-c', 'readlink /proc/self/fd/3; exit 7'], { allowFailure: true });
  t.equal(r.exitCode, 7, "the program's exit code");
  t.match(r.stdout, /^socket:\[\d+\]\n$/, 'fd 3 is a socket');
  t.ok(fs.statSync(sock).isSocket(), 'at the path given');
  t.equal(fs.statSync(sock).mode & 0o077, 0, 'for root only');
  // `boxd listen` as a program of its own (the helper off) makes the same socket.
  const sock2 = path.join(dir, 'b2.sock');
  const r2 = spawnSync(SPAWNER_BIN, ['listen', sock2, '/bin/sh', '-c', 'readlink /proc/self/fd/3'], { encoding: 'utf8', timeout: 10_000 });
  t.equal(r2.status, 0, r2.stderr);
  t.match(r2.stdout, /^socket:\[\d+\]\n$/, 'as a program: fd 3 is a socket');
  t.equal(fs.statSync(sock2).mode & 0o777, 0o600, 'made 0600');
  // A mount point made nosuid,nodev, its other flags kept.
  const mnt = path.join(dir, 'mnt');
  fs.mkdirSync(mnt);
  await run(['mount', '--bind', mnt, mnt]);
  t.teardown(() => run(['umount', '-l', mnt], { allowFailure: true }));
  await run(['mount', '-o', 'remount,bind,ro,noexec,noatime', mnt]);
  const flags = () => fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').find((l) => l.split(' ')[4] === mnt)!.split(' ')[5].split(',');
  t.notOk(flags().includes('nosuid'), 'control: not nosuid before');
  // The node names the options to keep, as mountinfo lists them (nothing asks the filesystem).
  t.equal(await remountPrivate(mnt, flags()), true, 'done by the helper');
  t.same(flags().filter((f) => ['ro', 'noexec', 'nosuid', 'nodev', 'noatime'].includes(f)).sort(), ['noatime', 'nodev', 'noexec', 'nosuid', 'ro'], 'nosuid,nodev, and still ro,noexec,noatime');
  await t.rejects(remountPrivate(path.join(dir, 'nope'), []), { code: 'ENOENT' }, 'a path that is not there: ENOENT');

  // make-private: the helper reads the mount table itself and remounts only what needs it.
  const mnt2 = path.join(dir, 'mnt two');
  fs.mkdirSync(mnt2);
  await run(['mount', '--bind', mnt2, mnt2]);
  t.teardown(() => run(['umount', '-l', mnt2], { allowFailure: true }));
  await run(['mount', '-o', 'remount,bind,ro,noatime', mnt2]);
  const flags2 = () => fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').find((l) => l.split(' ')[4] === mnt2.replace(/ /g, '\\040'))!.split(' ')[5].split(',');
  t.notOk(flags2().includes('nosuid'), 'control: not nosuid before');
  t.equal(await makePrivate(mnt2), 'remounted', 'a mount (its point with a space) that was not private: remounted');
  t.same(flags2().filter((f) => ['ro', 'nosuid', 'nodev', 'noatime'].includes(f)).sort(), ['noatime', 'nodev', 'nosuid', 'ro'], 'nosuid,nodev, and still ro,noatime');
  t.equal(await makePrivate(mnt2), 'private', 'asked again: it is already');
  t.equal(await makePrivate(dir), 'none', 'a directory that is no mount point: none, nothing done');
  t.equal(await makePrivate(path.join(dir, 'nope')), 'none', 'a path that is not there: none');
});

t.test('boxd refuses a mode it does not have: never a box agent on the host', async (t) => {
  const r = spawnSync(SPAWNER_BIN, ['no-such-mode'], { timeout: 10_000, encoding: 'utf8' });
  t.equal(r.status, 2, 'exit 2, at once');
  t.match(r.stderr, /unknown mode "no-such-mode"/, 'and says why');
});
