/**
 * What a soak host left on the machine of boxes that should be gone, looked at with the host
 * tools themselves (zfs, runc, ip, nft, /proc, /sys), not through the drivers under test. Only
 * this host's objects are looked at: they carry its host tag (docs/architecture.md "Host objects
 * of a box"). Boxes in `keep` (still alive by design) are allowed.
 */
import fs from 'node:fs';
import path from 'node:path';
import { run } from '../core/command';
import type { Config } from '../core/config';
import { RUNC_BIN } from '../workers/runtime/runc';
import { USERNS_DIR } from '../workers/runtime/userns';

export interface LeftoverScope {
  config: Config;
  /** The root dataset of the host's pool (`ZfsStorage.root`). */
  zfsRoot: string;
}

/** One kind of host object and what of it was left, by box id (or by name when no id). */
export interface Leftovers {
  /** kind → objects left (`datasets`, `containers`, `netns`, …). */
  found: Record<string, string[]>;
  /** Checks that could not run (a tool not answering), as `kind: reason`. */
  unchecked: string[];
}

const NETNS_DIR = '/run/netns';
const TOOL_TIMEOUT_MS = 60_000;
const BOX_ID = /^[a-z0-9]{1,32}$/;

export const leftoverCount = (l: Leftovers) => Object.values(l.found).reduce((n, v) => n + v.length, 0);

export function describeLeftovers(l: Leftovers): string[] {
  const out = Object.entries(l.found)
    .filter(([, v]) => v.length > 0)
    .map(([k, v]) => `${k}: ${v.length} (${v.slice(0, 5).join(', ')}${v.length > 5 ? ', …' : ''})`);
  return [...out, ...l.unchecked.map((u) => `not checked: ${u}`)];
}

export async function findLeftovers(scope: LeftoverScope, keep: ReadonlySet<string>): Promise<Leftovers> {
  const { config, zfsRoot } = scope;
  const tag = config.hostTag;
  const prefix = `bh${tag}-`;
  const found: Record<string, string[]> = {};
  const unchecked: string[] = [];
  const add = (kind: string, what: string) => (found[kind] ??= []).push(what);
  const stray = (id: string | null) => id !== null && !keep.has(id);
  const idOf = (name: string) => {
    if (!name.startsWith(prefix)) return null;
    const id = name.slice(prefix.length).replace(/\.ids$/, '');
    return BOX_ID.test(id) ? id : null;
  };
  const guard = async (kind: string, fn: () => Promise<void>) => {
    try {
      await fn();
    } catch (e) {
      unchecked.push(`${kind}: ${(e as Error).message.split('\n')[0].slice(0, 300)}`);
    }
  };
  for (const k of ['datasets', 'containers', 'bundles', 'netns', 'userns', 'mounts', 'veths', 'nft guards', 'cgroups', 'address leases', 'attach marks', 'exec files']) found[k] = [];

  await guard('datasets', async () => {
    // Every dataset and snapshot under <root>/boxes is a box's (or a snapshot of one).
    const r = await run(['zfs', 'list', '-H', '-o', 'name', '-t', 'all', '-r', `${zfsRoot}/boxes`], { timeoutMs: TOOL_TIMEOUT_MS });
    for (const name of r.stdout.split('\n').map((s) => s.trim()).filter(Boolean)) {
      const rest = name.slice(`${zfsRoot}/boxes`.length);
      if (!rest) continue;
      const id = rest.slice(1).split(/[/@]/)[0];
      if (!keep.has(id)) add('datasets', name);
    }
  });

  await guard('containers', async () => {
    const root = path.join(config.dataDir, 'runc');
    if (!fs.existsSync(root)) return;
    const r = await run([RUNC_BIN, '--root', root, 'list', '-q'], { timeoutMs: TOOL_TIMEOUT_MS });
    for (const cid of r.stdout.split('\n').map((s) => s.trim()).filter(Boolean)) if (stray(idOf(cid)) || idOf(cid) === null) add('containers', cid);
  });

  await guard('bundles', async () => {
    for (const id of readdir(path.join(config.dataDir, 'bundles'))) if (!keep.has(id)) add('bundles', id);
  });

  await guard('netns', async () => {
    for (const n of readdir(NETNS_DIR)) if (stray(idOf(n))) add('netns', n);
  });

  await guard('userns', async () => {
    for (const n of readdir(USERNS_DIR)) if (stray(idOf(n))) add('userns', n);
  });

  await guard('mounts', async () => {
    // nsfs bind mounts of this host's netns and user namespaces (a lazily unmounted one is gone).
    const dirs = [`${NETNS_DIR}/${prefix}`, `${USERNS_DIR}/${prefix}`];
    for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
      const mp = line.split(' ')[4];
      if (!mp) continue;
      const dir = dirs.find((d) => mp.startsWith(d));
      if (dir && stray(idOf(path.basename(mp)))) add('mounts', mp);
    }
  });

  // A box's attach mark names its veth (workers/network/cni.ts); the port guard's elements are
  // keyed on veths (workers/network/portGuard.ts).
  const vethOwner = new Map<string, string>();
  for (const id of readdir(path.join(config.dataDir, 'cni', 'attached'))) {
    const veth = (fs.readFileSync(path.join(config.dataDir, 'cni', 'attached', id), 'utf8').split('\n')[1] ?? '').trim();
    if (veth) vethOwner.set(veth, id);
  }
  await guard('nft', async () => {
    const table = `boxhost_${tag}`;
    const r = await run(['nft', '-j', 'list', 'table', 'bridge', table], { allowFailure: true, timeoutMs: TOOL_TIMEOUT_MS });
    if (r.exitCode !== 0) {
      if (/No such file|does not exist/i.test(r.stderr)) return;
      throw new Error(r.stderr.trim());
    }
    const objects = (JSON.parse(r.stdout).nftables ?? []) as any[];
    for (const o of objects) {
      if (!o.set) continue;
      for (const e of o.set.elem ?? []) {
        const veth = typeof e === 'string' ? e : Array.isArray(e?.concat) ? String(e.concat[0]) : null;
        if (veth === null) continue;
        const owner = vethOwner.get(veth);
        if (!owner || !keep.has(owner)) add('nft guards', `${o.set.name}: ${veth}${owner ? `→${owner}` : ''}`);
      }
    }
  });

  await guard('veths', async () => {
    // Ports on this host's project bridges that no kept box owns.
    const bridgePrefix = `bh${tag.slice(0, 4)}p`;
    const br = await run(['ip', '-j', 'link', 'show', 'type', 'bridge'], { timeoutMs: TOOL_TIMEOUT_MS });
    const bridges = (JSON.parse(br.stdout || '[]') as { ifname: string }[]).map((b) => b.ifname).filter((n) => n.startsWith(bridgePrefix) && /^\d+$/.test(n.slice(bridgePrefix.length)));
    for (const b of bridges) {
      const ports = await run(['ip', '-j', 'link', 'show', 'master', b], { timeoutMs: TOOL_TIMEOUT_MS });
      for (const p of JSON.parse(ports.stdout || '[]') as { ifname: string }[]) {
        const owner = vethOwner.get(p.ifname);
        if (!owner || !keep.has(owner)) add('veths', `${p.ifname}@${b}${owner ? `→${owner}` : ''}`);
      }
    }
  });

  await guard('cgroups', async () => {
    const controllers = readdir('/sys/fs/cgroup');
    const seen = new Set<string>();
    for (const dir of ['/sys/fs/cgroup', ...controllers.map((c) => path.join('/sys/fs/cgroup', c))]) {
      for (const n of readdir(dir)) if (stray(idOf(n)) && !seen.has(n)) (seen.add(n), add('cgroups', n));
    }
  });

  await guard('address leases', async () => {
    // host-local IPAM: one file per leased address, holding the netns name (docs: CNI).
    const ipam = path.join(config.dataDir, 'cni', 'ipam');
    for (const net of readdir(ipam)) {
      for (const f of readdir(path.join(ipam, net))) {
        if (!/^\d+\.\d+\.\d+\.\d+$/.test(f)) continue;
        const owner = (fs.readFileSync(path.join(ipam, net, f), 'utf8').split(/\r?\n/)[0] ?? '').trim();
        if (stray(idOf(owner)) || idOf(owner) === null) add('address leases', `${f}→${owner}`);
      }
    }
  });

  await guard('attach marks', async () => {
    for (const id of readdir(path.join(config.dataDir, 'cni', 'attached'))) if (!keep.has(id)) add('attach marks', id);
  });

  await guard('exec files', async () => {
    // Pid, log and process files of execs: none once no exec runs. FIFOs are made 32 at a time
    // and handed out as execs start (workers/runtime/exec.ts takeFifos): the spares of the one
    // batch being used up are expected; more, or of older batches, are leaks.
    const files = readdir(path.join(config.dataDir, 'exec'));
    const fifos = files.filter((f) => /^fifo-[0-9a-f]{12}-\d+$/.test(f));
    const batches = new Set(fifos.map((f) => f.slice(0, 'fifo-'.length + 12)));
    const spares = batches.size === 1 && fifos.length < 32 ? new Set(fifos) : new Set<string>();
    for (const f of files) if (!spares.has(f)) add('exec files', f);
  });

  return { found, unchecked };
}

function readdir(dir: string): string[] {
  try {
    return fs.readdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
}
