import fs from 'node:fs';
import path from 'node:path';
import type { Config } from '../../core/config';
import { run } from '../../core/command';

/**
 * The host objects of one box, counted where the drivers keep them (docs/architecture.md, "Host
 * objects of a box"), for tests that assert what exists at a given moment: `t.same(await
 * boxObjects(cfg, id), {...})`. Every count is what the machine says, not what the db says.
 */
export interface BoxObjects {
  /** `<pool>/boxes/<id>` */
  root: number;
  /** Snapshots of the box's root. */
  snapshots: number;
  /** Snapshots on other roots that name the box: the `_fork-<id>` snapshot of its fork source. */
  forkSnapshots: number;
  /** runc containers of the box, and the status of the first. */
  containers: number;
  status: string | null;
  /** `<data dir>/bundles/<id>` */
  bundle: number;
  /** `/run/netns/bh<tag>-<id>` */
  netns: number;
  /** `/run/boxhost/userns/bh<tag>-<id>` */
  userns: number;
  /** host-local leases holding the box's netns name (one address). */
  leases: number;
  /** Elements of the port guard (workers/network/portGuard.ts) keyed on the box's host-side veth:
   *  3 when guarded (ports, macs, addrs). */
  guardElements: number;
  /** cgroup directories of the box's container (memory controller). */
  cgroups: number;
}

/** The dataset the storage driver keeps its tree under (the loop-file pool itself by default). */
export const poolOf = (config: Config) => (config.zfsPool ? `${config.zfsPool}/boxhost` : `boxhost-${config.hostTag}`);

async function zfsNames(config: Config): Promise<string[]> {
  const r = await run(['zfs', 'list', '-H', '-o', 'name', '-t', 'all', '-r', poolOf(config)], { allowFailure: true, timeoutMs: 60_000 });
  return r.stdout.split('\n').filter(Boolean);
}

/** The port guard's elements by set, as `nft -j` prints them (a veth, or [veth, mac|address]). */
export async function guardSets(config: Config): Promise<Map<string, unknown[]>> {
  const r = await run(['nft', '-j', 'list', 'table', 'bridge', `boxhost_${config.hostTag}`], { allowFailure: true });
  const out = new Map<string, unknown[]>();
  if (r.exitCode !== 0) return out;
  for (const o of (JSON.parse(r.stdout) as { nftables?: { set?: { name: string; elem?: unknown[] } }[] }).nftables ?? []) if (o.set) out.set(o.set.name, o.set.elem ?? []);
  return out;
}

/** The veth an element is keyed on. */
export const elementVeth = (e: unknown): string | null => (typeof e === 'string' ? e : Array.isArray((e as { concat?: unknown[] })?.concat) ? String((e as { concat: unknown[] }).concat[0]) : null);

/** The box's host-side veth: its attached mark names it; else its eth0's peer (a port guarded
 *  by a worker that died before writing the mark). */
async function boxVeth(config: Config, cid: string, boxId: string): Promise<string | null> {
  const marked = (fs.existsSync(path.join(config.dataDir, 'cni', 'attached', boxId)) ? fs.readFileSync(path.join(config.dataDir, 'cni', 'attached', boxId), 'utf8') : '').split('\n')[1];
  if (marked) return marked;
  const eth0 = await run(['ip', '-n', cid, '-j', 'link', 'show', 'dev', 'eth0'], { allowFailure: true });
  if (eth0.exitCode !== 0) return null;
  const peer = (JSON.parse(eth0.stdout) as { link_index?: number }[])[0]?.link_index;
  const links = JSON.parse((await run(['ip', '-j', 'link', 'show', 'type', 'veth'])).stdout) as { ifindex: number; ifname: string }[];
  return links.find((l) => l.ifindex === peer)?.ifname ?? null;
}

export async function boxObjects(config: Config, boxId: string): Promise<BoxObjects> {
  const cid = `bh${config.hostTag}-${boxId}`;
  const [names, sets, veth, runc] = await Promise.all([
    zfsNames(config),
    guardSets(config),
    boxVeth(config, `bh${config.hostTag}-${boxId}`, boxId),
    run(['runc', '--root', path.join(config.dataDir, 'runc'), 'list', '--format', 'json'], { allowFailure: true }),
  ]);
  const rootDs = `${poolOf(config)}/boxes/${boxId}`;
  const containers = ((JSON.parse(runc.stdout.trim() || 'null') ?? []) as { id: string; status: string }[]).filter((c) => c.id === cid);
  let leases = 0;
  const ipam = path.join(config.dataDir, 'cni', 'ipam');
  for (const net of fs.existsSync(ipam) ? fs.readdirSync(ipam) : []) {
    const dir = path.join(ipam, net);
    if (!fs.statSync(dir).isDirectory()) continue;
    for (const f of fs.readdirSync(dir)) {
      if (!/^\d+\.\d+\.\d+\.\d+$/.test(f)) continue;
      if (fs.readFileSync(path.join(dir, f), 'utf8').split(/\r?\n/)[0] === cid) leases++;
    }
  }
  const exists = (p: string) => (fs.existsSync(p) ? 1 : 0);
  return {
    root: names.filter((n) => n === rootDs).length,
    snapshots: names.filter((n) => n.startsWith(`${rootDs}@`)).length,
    forkSnapshots: names.filter((n) => !n.startsWith(`${rootDs}@`) && n.endsWith(`@_fork-${boxId}`)).length,
    containers: containers.length,
    status: containers[0]?.status ?? null,
    bundle: exists(path.join(config.dataDir, 'bundles', boxId)),
    netns: exists(`/run/netns/${cid}`),
    userns: exists(`/run/boxhost/userns/${cid}`),
    leases,
    guardElements: veth ? [...sets.values()].flat().filter((e) => elementVeth(e) === veth).length : 0,
    cgroups: exists(`/sys/fs/cgroup/memory/${cid}`),
  };
}

/** Nothing of the box anywhere on the host. */
export const NOTHING: BoxObjects = {
  root: 0,
  snapshots: 0,
  forkSnapshots: 0,
  containers: 0,
  status: null,
  bundle: 0,
  netns: 0,
  userns: 0,
  leases: 0,
  guardElements: 0,
  cgroups: 0,
};

/** One of everything a running box holds (a fork also holds one `_fork-<id>` snapshot on its
 *  source). */
export const RUNNING: BoxObjects = {
  root: 1,
  snapshots: 0,
  forkSnapshots: 0,
  containers: 1,
  status: 'running',
  bundle: 1,
  netns: 1,
  userns: 1,
  leases: 1,
  guardElements: 3,
  cgroups: 1,
};

/** What the host holds of every box of a data dir, by kind: the datasets under `boxes/`, the
 *  containers, the netns of this host tag, for "nothing is left" comparisons before and after. */
export async function hostInventory(config: Config): Promise<{ datasets: string[]; containers: string[]; netns: string[]; leases: string[] }> {
  const names = await zfsNames(config);
  const runc = await run(['runc', '--root', path.join(config.dataDir, 'runc'), 'list', '-q'], { allowFailure: true });
  const netns = (fs.existsSync('/run/netns') ? fs.readdirSync('/run/netns') : []).filter((n) => n.startsWith(`bh${config.hostTag}-`));
  const leases: string[] = [];
  const ipam = path.join(config.dataDir, 'cni', 'ipam');
  for (const net of fs.existsSync(ipam) ? fs.readdirSync(ipam) : []) {
    const dir = path.join(ipam, net);
    if (!fs.statSync(dir).isDirectory()) continue;
    for (const f of fs.readdirSync(dir)) if (/^\d+\.\d+\.\d+\.\d+$/.test(f)) leases.push(`${net}/${f}`);
  }
  return {
    datasets: names.filter((n) => n.includes('/boxes/')).sort(),
    containers: runc.stdout.split('\n').filter(Boolean).sort(),
    netns: netns.sort(),
    leases: leases.sort(),
  };
}

/** Counts of boxes and operations rows (numbers on sqlite and PostgreSQL alike). */
export async function rowCounts(db: any): Promise<{ boxes: number; operations: number }> {
  const n = async (table: string) => Number((await db(table).count({ n: '*' }))[0].n);
  return { boxes: await n('boxes'), operations: await n('operations') };
}
