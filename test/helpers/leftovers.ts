import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import knex from 'knex';
import { run } from '../../core/command';
import { PG } from './db';

/**
 * What the test suite may leave on the machine, found by name: every test host's objects are
 * named by its host tag (6 hex digits, from its data dir) or live under its data dir, and the
 * data dirs of the suite are made under /var/tmp (or the temp dir) with the prefixes below.
 *
 * `leftoversOf({hostTag, dataDir})` looks for one host's; `leftoversOf({})` for the whole
 * suite's (test/zz-leftovers.test.ts). Each entry is a line naming what is left.
 */
export interface Scope {
  /** Only objects named by this host tag. */
  hostTag?: string;
  /** Only mounts under, and the existence of, this data dir. */
  dataDir?: string;
}

/** Where the suite makes its data dirs and scratch dirs (test/helpers/host.ts testDataDir, the
 *  driver tests, the cluster helpers, the probes). `boxhost-bench-*` and `boxhost-soak-*` hold
 *  the results `npm run bench` and `npm run soak` keep on purpose: not the suite's. */
const TEMP_ROOTS = [...new Set(['/var/tmp', os.tmpdir(), '/tmp'])];
const SUITE_DIR_RE = /^(bh-test-|bh-redis-|bh-api-|bh-repo-|bh-probe-|boxhost-(?!bench-|soak-)|box-cli-)/;

/** A host tag is 6 hex digits; box netns, containers and cgroups are `bh<tag>-<id>`. */
const TAGGED_RE = /^bh([0-9a-f]{6})-/;

/** The real host this checkout may run (`npm start` in the repo: `.boxhost`), never the suite's. */
function excludedTags(): Set<string> {
  const out = new Set<string>();
  for (const dir of [path.resolve(__dirname, '..', '..', '..', '.boxhost'), process.env.BOXHOST_DATA_DIR]) {
    if (dir && fs.existsSync(dir)) out.add(crypto.createHash('sha256').update(path.resolve(dir)).digest('hex').slice(0, 6));
  }
  return out;
}

const quiet = (argv: string[], timeoutMs = 30_000) => run(argv, { allowFailure: true, timeoutMs }).catch((e: Error) => ({ exitCode: -1, stdout: '', stderr: e.message }));

/** Dirs of the suite under the temp roots (all of them, or the one data dir of a scope). */
function suiteDirs(scope: Scope): string[] {
  if (scope.dataDir) return fs.existsSync(scope.dataDir) ? [scope.dataDir] : [];
  const out: string[] = [];
  for (const root of TEMP_ROOTS) {
    for (const name of fs.existsSync(root) ? fs.readdirSync(root) : []) if (SUITE_DIR_RE.test(name)) out.push(path.join(root, name));
  }
  return out;
}

export async function leftoversOf(scope: Scope): Promise<string[]> {
  const left: string[] = [];
  const skip = excludedTags();
  const tagOk = (tag: string) => (scope.hostTag ? tag === scope.hostTag : !skip.has(tag));
  const tagged = (name: string) => {
    const m = TAGGED_RE.exec(name);
    return m !== null && tagOk(m[1]);
  };

  // ZFS: the suite's pools are `boxhost-<tag>` (the loop-file pools of test hosts and of the
  // storage driver test).
  const pools = await quiet(['zpool', 'list', '-H', '-o', 'name']);
  if (pools.exitCode !== 0) left.push(`ZFS did not answer \`zpool list\` (${pools.stderr.trim() || `exit ${pools.exitCode}`}): pools and datasets unknown`);
  for (const pool of pools.stdout.split('\n').filter(Boolean)) {
    const m = /^boxhost-([0-9a-f]{6})$/.exec(pool);
    if (!m || !tagOk(m[1])) continue;
    const ds = await quiet(['zfs', 'list', '-H', '-o', 'name', '-t', 'all', '-r', pool]);
    const names = ds.stdout.split('\n').filter(Boolean);
    left.push(`ZFS pool ${pool} with ${names.length} datasets and snapshots${names.length > 1 ? `: ${names.slice(1, 6).join(', ')}${names.length > 6 ? ', …' : ''}` : ''}`);
  }

  // Containers: runc's state under each runc root of the suite's data dirs, and the cgroups of
  // containers whose state went with their data dir (their processes may still run).
  for (const dir of suiteDirs(scope)) {
    for (const root of [path.join(dir, 'runc'), path.join(dir, 'data', 'runc')]) {
      if (!fs.existsSync(root)) continue;
      const r = await quiet(['runc', '--root', root, 'list', '-q']);
      for (const id of r.stdout.split('\n').filter(Boolean)) left.push(`runc container ${id} (root ${root})`);
    }
  }
  const cgroupSeen = new Set<string>();
  for (const ctrl of fs.existsSync('/sys/fs/cgroup') ? fs.readdirSync('/sys/fs/cgroup') : []) {
    const dir = path.join('/sys/fs/cgroup', ctrl);
    let names: string[] = [];
    try {
      names = fs.readdirSync(dir);
    } catch {
      continue;
    }
    for (const n of names.filter(tagged)) {
      if (cgroupSeen.has(n)) continue;
      cgroupSeen.add(n);
      let procs = 0;
      try {
        procs = fs.readFileSync(path.join(dir, n, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).length;
      } catch {
        /* no procs file in this controller */
      }
      left.push(`cgroup ${n} (${ctrl}${procs ? `, ${procs} processes in it` : ''})`);
    }
  }

  // Network namespaces, and the user namespaces kept beside them.
  const netns = fs.existsSync('/run/netns') ? fs.readdirSync('/run/netns') : [];
  for (const n of netns) {
    if (scope.hostTag ? tagged(n) : /^bh/.test(n) && (!TAGGED_RE.test(n) || tagged(n))) left.push(`netns ${n}`);
  }
  const userns = fs.existsSync('/run/boxhost/userns') ? fs.readdirSync('/run/boxhost/userns') : [];
  for (const n of userns) if (tagged(n)) left.push(`user namespace /run/boxhost/userns/${n}`);

  // Links: the suite's bridges are `bh<first 4 of the tag>p<index>`; its own test veths `bh…`.
  const links = await quiet(['ip', '-j', 'link', 'show']);
  let linkList: { ifname: string; master?: string; link_type?: string; linkinfo?: unknown }[] = [];
  try {
    linkList = JSON.parse(links.stdout || '[]');
  } catch {
    left.push('`ip -j link show` did not answer JSON: links unknown');
  }
  const linkOk = (name: string) => (scope.hostTag ? name.startsWith(`bh${scope.hostTag.slice(0, 4)}p`) : /^bh/.test(name) && ![...skip].some((t) => name.startsWith(`bh${t.slice(0, 4)}p`)));
  for (const l of linkList) {
    if (linkOk(l.ifname)) left.push(`link ${l.ifname}`);
    else if (l.master && linkOk(l.master)) left.push(`link ${l.ifname} (a port of bridge ${l.master})`);
  }
  const rules = await quiet(['ip', 'rule', 'show']);
  for (const line of rules.stdout.split('\n')) if (/iif (bh\S+)/.exec(line) && linkOk(/iif (bh\S+)/.exec(line)![1])) left.push(`ip rule: ${line.trim()}`);

  // Firewall: iptables and ip6tables chains BH-<tag>-*, nftables tables boxhost_<tag>.
  for (const tool of ['iptables', 'ip6tables']) {
    for (const table of ['filter', 'nat']) {
      const r = await quiet([tool, '-w', '-t', table, '-S']);
      for (const line of r.stdout.split('\n')) {
        const m = /^-N (BH-([0-9a-f]{6})-\S+)/.exec(line);
        if (m && tagOk(m[2])) left.push(`${tool} chain ${m[1]} (table ${table})`);
      }
    }
  }
  const nft = await quiet(['nft', 'list', 'tables']);
  for (const line of nft.stdout.split('\n')) {
    const m = /^table (\S+) (boxhost_([0-9a-f]{6}))$/.exec(line.trim());
    if (m && tagOk(m[3])) left.push(`nft table ${m[1]} ${m[2]}`);
  }

  // Mounts: FUSE (zfs-fuse datasets), nsfs (netns, user namespaces) and binds under the suite's
  // dirs, /run/boxhost and /run/netns.
  const mountinfo = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  for (const line of mountinfo) {
    const f = line.split(' ');
    const point = f[4]?.replace(/\\040/g, ' ');
    if (!point) continue;
    const type = f[f.indexOf('-') + 1];
    const under = scope.dataDir
      ? point === scope.dataDir || point.startsWith(`${scope.dataDir}/`) || (scope.hostTag !== undefined && /^\/run\/(netns|boxhost\/userns)\//.test(point) && tagged(path.basename(point)))
      : TEMP_ROOTS.some((r) => point.startsWith(`${r}/`) && SUITE_DIR_RE.test(point.slice(r.length + 1))) ||
        (/^\/run\/(netns|boxhost\/userns)\//.test(point) && /^bh/.test(path.basename(point)) && (!TAGGED_RE.test(path.basename(point)) || tagged(path.basename(point))));
    if (under) left.push(`mount ${point} (${type})`);
  }

  // Processes: an embedded redis-server of a test host whose host did not stop it.
  const ps = await quiet(['ps', '-eo', 'pid=,args=']);
  for (const line of ps.stdout.split('\n')) {
    if (!/redis-server/.test(line)) continue;
    const hit = scope.dataDir ? line.includes(scope.dataDir) : TEMP_ROOTS.some((r) => new RegExp(`${r}/(bh-|boxhost-)`).test(line));
    if (hit) left.push(`process ${line.trim()}`);
  }

  // The suite's own directories (data dirs, scratch dirs).
  for (const dir of suiteDirs(scope)) left.push(`directory ${dir}`);

  // PostgreSQL schemas of the suite's hosts and clusters (whole suite only).
  if (!scope.hostTag && !scope.dataDir) {
    const pg = knex({ client: 'pg', connection: PG, pool: { min: 0, max: 1 }, acquireConnectionTimeout: 5000 });
    try {
      const schemas = await pg('information_schema.schemata').where('schema_name', 'like', 'bh\\_test\\_%').pluck('schema_name');
      for (const s of schemas) left.push(`PostgreSQL schema ${s}`);
    } catch (e) {
      left.push(`PostgreSQL did not answer (${(e as Error).message}): schemas unknown`);
    } finally {
      await pg.destroy();
    }
  }
  return left;
}
