import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { cleanupHost } from './cleanup';
import { ensureNetnsDir, NETNS_DIR } from '../../workers/runtime/netnsDir';
import { loadConfig } from '../../core/config';
import { liveOwner } from './owner';

/**
 * Run before the suite (`npm test`): removes what an earlier run of the suite left behind when it
 * was killed mid-way (a machine restarted under it, a test killed at its timeout), so the last
 * test's "nothing of the suite is left" (test/zz-leftovers.test.ts) judges this run only. A test
 * host's data dir names it (its host tag is a hash of the path), so each is torn down with the
 * teardown the tests use; a driver test's dir (storage, runtime, boxd, CNI) carries the random
 * tag it named its pool, containers, netns and chains with, and goes the same way. A run
 * SIGKILLed inside the storage test once left its pool mounted and failed the next CI run. Under CI every such dir is stale (CI runs one suite on its machine);
 * elsewhere only those untouched for an hour, so a suite running beside this one is left alone.
 * Either way a dir whose owner still runs (test/helpers/owner.ts: a test host's data dir, a
 * driver test's dir) is never touched: a sweep started by hand beside a live suite tore its
 * hosts down under it.
 */
const STALE_MS = process.env.CI === 'true' ? 0 : 3600_000;
/** `BOXHOST_SWEEP_ROOTS` (colon-separated) narrows where it looks: test/sweep.test.ts sweeps a
 *  temp root of its own, not the machine. */
const ROOTS = process.env.BOXHOST_SWEEP_ROOTS ? process.env.BOXHOST_SWEEP_ROOTS.split(':').filter(Boolean) : [...new Set(['/var/tmp', os.tmpdir(), '/tmp'])];
const HOST_DIR_RE = /^bh-test-/;
/** A driver test's dir names the host tag it made its objects with (`boxhost-<kind>-<tag>-XXXXXX`:
 *  netns, containers, cgroups, chains, a `boxhost-<tag>` pool). */
const DRIVER_DIR_RE = /^boxhost-(?!bench-|soak-)[a-z-]+?-((?:zt)?[0-9a-f]{6})-[A-Za-z0-9]{6}$/;
const OTHER_DIR_RE = /^(bh-redis-|bh-api-|bh-repo-|bh-probe-|box-cli-|boxhost-(?!bench-|soak-))/;

/**
 * Kills what still runs for `dir`: a redis-server whose arguments name a path in it (the killed
 * host's embedded redis, health.test's), and any process whose BOXHOST_DATA_DIR is it (a killed
 * run's node or worker processes). Nothing else: an editor or a `tail` on a file there lives.
 */
function killUnder(dir: string): void {
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid)) {
    try {
      const comm = fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
      const args = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      const env = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      const redis = comm === 'redis-server' && args.some((a) => a === dir || a.startsWith(`${dir}/`) || a.includes(`:${dir}/`));
      const data = env.some((e) => e === `BOXHOST_DATA_DIR=${dir}` || e.startsWith(`BOXHOST_DATA_DIR=${dir}/`));
      if (redis || data) process.kill(Number(pid), 'SIGKILL');
    } catch {
      /* gone meanwhile */
    }
  }
}

/** Mount points at or under `dir`, deepest first. */
function mountsUnder(dir: string): string[] {
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4]?.replace(/\\040/g, ' '))
    .filter((p): p is string => !!p && (p === dir || p.startsWith(`${dir}/`)))
    .sort((a, b) => b.length - a.length);
}

/** runc state roots under `dir` (`<dir>/runc`, `<dir>/legacy/runc`, …), never inside a mount. */
function runcRoots(dir: string, depth = 3): string[] {
  const mounts = new Set(mountsUnder(dir));
  const out: string[] = [];
  const walk = (d: string, left: number) => {
    let entries: fs.Dirent[] = [];
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = path.join(d, e.name);
      if (!e.isDirectory() || mounts.has(p)) continue;
      if (e.name === 'runc') out.push(p);
      else if (left > 0) walk(p, left - 1);
    }
  };
  walk(dir, depth);
  return out;
}

/** Containers of a killed driver test go first (their netns and mounts are held by them). */
function removeContainers(dir: string): void {
  for (const root of runcRoots(dir)) {
    const ids = spawnSync('runc', ['--root', root, 'list', '-q'], { encoding: 'utf8' }).stdout ?? '';
    for (const id of ids.split('\n').filter(Boolean)) spawnSync('runc', ['--root', root, 'delete', '-f', id]);
  }
}

/** Lets go what is still mounted under `dir` and removes it (a mount point is emptied, never
 *  recursed into while mounted). */
function removeDir(dir: string): void {
  const mounts = mountsUnder(dir);
  for (const m of mounts) spawnSync('umount', ['-l', m]);
  if (mountsUnder(dir).length) throw new Error('still mounted');
  fs.rmSync(dir, { recursive: true, force: true });
}

async function main(): Promise<void> {
  // Before any test host mounts a netns: /run/netns its own shared mount (netnsDir.ts), so
  // that two test files starting side by side on a fresh machine cannot hide each other's.
  await ensureNetnsDir(NETNS_DIR, (m) => process.stderr.write(`sweep: ${m}\n`));
  const now = Date.now();
  const stale = (p: string) => now - fs.statSync(p).mtimeMs >= STALE_MS;
  let swept = 0;
  for (const root of ROOTS) {
    for (const name of fs.existsSync(root) ? fs.readdirSync(root) : []) {
      const dir = path.join(root, name);
      try {
        // A real directory of root's only: a link or someone else's entry in a shared temp dir
        // is never acted on.
        const st = fs.lstatSync(dir);
        if (!st.isDirectory() || st.uid !== 0) continue;
        const owner = (HOST_DIR_RE.test(name) || DRIVER_DIR_RE.test(name)) && liveOwner(dir);
        if (owner) {
          process.stderr.write(`sweep: ${dir} is in use by process ${owner}; left alone\n`);
          continue;
        }
        if (HOST_DIR_RE.test(name) && stale(dir)) {
          killUnder(dir);
          const problems = await cleanupHost(loadConfig({ BOXHOST_DATA_DIR: dir, LOG_LEVEL: 'warn' }, { readDotenv: false }), () => undefined);
          process.stderr.write(`sweep: an earlier run's test host ${dir}${problems.length ? `: ${problems.join('; ')}` : ' removed'}\n`);
          swept++;
        } else if (DRIVER_DIR_RE.test(name) && stale(dir)) {
          // A driver test killed mid-way (the storage, runtime, boxd or CNI tests): its
          // objects are torn down by the tag its dir names, then the dir goes.
          killUnder(dir);
          removeContainers(dir);
          const hostTag = DRIVER_DIR_RE.exec(name)![1];
          const config = { ...loadConfig({ BOXHOST_DATA_DIR: dir, LOG_LEVEL: 'warn' }, { readDotenv: false }), hostTag };
          const problems = await cleanupHost(config, () => undefined);
          if (fs.existsSync(dir)) removeDir(dir);
          process.stderr.write(`sweep: an earlier run's driver test dir ${dir}${problems.length ? `: ${problems.join('; ')}` : ' removed'}\n`);
          swept++;
        } else if (OTHER_DIR_RE.test(name) && stale(dir)) {
          // A mount there (the read-only bind of the checkout, bh-repo-*) is let go, never
          // recursed into. A mount point's mtime is its mounted tree's: outside CI its age says
          // nothing, so it is left.
          const mounts = mountsUnder(dir);
          if (mounts.length && STALE_MS > 0) continue;
          killUnder(dir);
          removeContainers(dir);
          removeDir(dir);
          swept++;
        }
      } catch (e) {
        process.stderr.write(`sweep: ${dir}: ${(e as Error).message}\n`);
      }
    }
  }
  if (swept) process.stderr.write(`sweep: ${swept} leftovers of earlier runs handled\n`);
}

main().catch((e) => {
  process.stderr.write(`sweep failed: ${(e as Error).message}\n`);
});
