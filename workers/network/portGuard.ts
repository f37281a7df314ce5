import { CommandError, run } from '../../core/command';
import { nftElements } from '../../core/spawner';
import type { DriverLogger } from '../drivers';

/** A box's side of its bridge: the host end of its veth, and what may come out of it. */
export interface BoxPort {
  veth: string;
  mac: string;
  address: string;
}

export const IFNAME_RE = /^[A-Za-z0-9_.-]{1,15}$/;
export const MAC_RE = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const IPV4_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
/** NFPROTO_BRIDGE. */
const FAMILY_BRIDGE = 7;
/** Marks the guard's rules, so a table of another layout (an older version's) is told apart. */
const RULE_MARK = 'boxhost port guard v2';

/**
 * The port guard: what may come out of a box's side of its bridge. One nftables table per host
 * tag (family bridge), made once, whose base chain looks every frame entering a bridge port up in
 * three sets keyed on the port (the host-side veth):
 *
 * - `ports`: the guarded veths. A frame from a port not in it is none of this table's business
 *   (another host tag's bridge, a veth the CNI plugin is still wiring: as before, a box joins
 *   unguarded for the moment between its veth and its elements, while its container starts);
 * - `macs` (veth . MAC): its frames must carry the box's MAC, and its ARP must claim that MAC;
 * - `addrs` (veth . IPv4): its IPv4 and its ARP must claim the box's own address;
 * - and only IPv4 and ARP at all (no IPv6 neighbour spoofing, VLAN tags or other L2 protocols).
 *
 * A box is guarded by adding its three elements in one transaction, over netlink through the
 * host helper (boxd/nftelem.go: ≈2 ms, where an `nft` process cost ≈45 ms of CPU here and a chain
 * per box made every later `nft` call slower with the box count); `nft` itself when the helper is
 * off. The table's layout is checked and written with `nft`, at a node's start.
 */
export class PortGuard {
  constructor(
    readonly table: string,
    private readonly logger?: DriverLogger,
  ) {}

  /** The table, its sets and its chain, written whole (a table of another layout is replaced). */
  private layout(): string[] {
    const t = this.table;
    const rule = (n: number, r: string) => `add rule bridge ${t} prerouting ${r} comment "${RULE_MARK} ${n}"`;
    return [
      `add table bridge ${t}`,
      `delete table bridge ${t}`,
      `add table bridge ${t}`,
      `add set bridge ${t} ports { type ifname; }`,
      `add set bridge ${t} macs { type ifname . ether_addr; }`,
      `add set bridge ${t} addrs { type ifname . ipv4_addr; }`,
      `add chain bridge ${t} prerouting { type filter hook prerouting priority -200; policy accept; }`,
      rule(1, 'iifname != @ports accept'),
      rule(2, 'iifname . ether saddr != @macs drop'),
      rule(3, 'ether type != { ip, arp } drop'),
      rule(4, 'ether type arp iifname . arp saddr ether != @macs drop'),
      rule(5, 'ether type arp iifname . arp saddr ip != @addrs drop'),
      rule(6, 'ether type ip iifname . ip saddr != @addrs drop'),
    ];
  }

  /** The table as `nft -j` prints it; null when there is none. */
  private async read(): Promise<NftObject[] | null> {
    const res = await run(['nft', '-j', 'list', 'table', 'bridge', this.table], { allowFailure: true });
    if (res.exitCode !== 0) {
      if (/No such file|does not exist/i.test(res.stderr)) return null;
      throw new CommandError(['nft', 'list', 'table', 'bridge', this.table], res.exitCode, res.stdout, res.stderr);
    }
    return (JSON.parse(res.stdout) as { nftables?: NftObject[] }).nftables ?? [];
  }

  /**
   * Makes the table as it should be. A table of this layout is left as it is (false). Otherwise
   * it is written whole (true), and in the same transaction it is given back every port it held
   * (when its sets had this layout's types) and every port `carried` names (the node's attached
   * boxes, from their marks and interfaces): no port is unguarded while the table is replaced.
   */
  async ensure(carried: () => Promise<BoxPort[]> = async () => []): Promise<boolean> {
    const objs = await this.read();
    const rules = (objs ?? []).filter((o) => o.rule?.chain === 'prerouting').map((o) => o.rule!.comment ?? '');
    const sets = new Map((objs ?? []).filter((o) => o.set).map((o) => [o.set!.name, JSON.stringify(o.set!.type)]));
    const typed =
      sets.get('ports') === JSON.stringify('ifname') &&
      sets.get('macs') === JSON.stringify(['ifname', 'ether_addr']) &&
      sets.get('addrs') === JSON.stringify(['ifname', 'ipv4_addr']);
    const ready = objs !== null && typed && rules.length === 6 && rules.every((c, i) => c === `${RULE_MARK} ${i + 1}`);
    if (ready) return false;
    // Every element the table held, as it was (a port half guarded stays so: in `ports`, its
    // frames are dropped), and every valid carried port in full.
    const elements = new Set<string>();
    const add = (set: string, port: BoxPort) => elements.add(`add element bridge ${this.table} ${set} { ${textOf(set, port)} }`);
    if (objs !== null && typed) {
      const held = elementsOf(objs);
      for (const veth of held.ports) if (IFNAME_RE.test(veth)) add('ports', { veth, mac: '', address: '' });
      for (const [veth, macs] of held.macs) for (const mac of macs) if (IFNAME_RE.test(veth) && MAC_RE.test(mac)) add('macs', { veth, mac, address: '' });
      for (const [veth, addrs] of held.addrs) for (const address of addrs) if (IFNAME_RE.test(veth) && IPV4_RE.test(address)) add('addrs', { veth, mac: '', address });
    }
    const ports = (await carried()).filter((port) => IFNAME_RE.test(port.veth) && MAC_RE.test(port.mac) && IPV4_RE.test(port.address));
    for (const port of ports) for (const set of ['ports', 'macs', 'addrs']) add(set, port);
    await run(['nft', '-f', '-'], { input: [...this.layout(), ...elements].join('\n') + '\n' });
    this.logger?.info({ table: this.table, replaced: objs !== null, ports: ports.length, elements: elements.size }, 'port guard table written');
    return true;
  }

  /** Removes the table (every guard with it). */
  async drop(): Promise<void> {
    await run(['nft', '-f', '-'], { input: `add table bridge ${this.table}\ndelete table bridge ${this.table}\n` });
  }

  /** Guards the port: its three elements in one transaction. Idempotent. */
  async guard(port: BoxPort): Promise<void> {
    check(port);
    const sets = keysOf(port);
    const done = await nftElements({ family: FAMILY_BRIDGE, table: this.table, sets });
    if (done) return;
    await run(['nft', '-f', '-'], { input: sets.map(({ set }) => `add element bridge ${this.table} ${set} { ${textOf(set, port)} }`).join('\n') + '\n' });
  }

  /**
   * Removes the port's elements, whichever of them are there (a port half guarded, or guarded by
   * a worker that died before its mark was written). The MAC may be unknown (a mark of an older
   * version): then the port's `macs` elements are looked up.
   */
  async unguard(port: { veth: string; mac?: string; address?: string }): Promise<void> {
    if (!IFNAME_RE.test(port.veth)) throw new Error(`bad veth ${port.veth}`);
    let ports: BoxPort[];
    if (port.mac && port.address) ports = [{ veth: port.veth, mac: port.mac, address: port.address }];
    else {
      const held = await this.elements();
      ports = [{ veth: port.veth, mac: held.macs.get(port.veth)?.[0] ?? '', address: held.addrs.get(port.veth)?.[0] ?? '' }];
      for (const mac of held.macs.get(port.veth)?.slice(1) ?? []) ports.push({ veth: port.veth, mac, address: '' });
      for (const address of held.addrs.get(port.veth)?.slice(1) ?? []) ports.push({ veth: port.veth, mac: '', address });
    }
    for (const p of ports) {
      const sets = keysOf(p).filter((s) => s.keys.length > 0);
      // One transaction first; a missing element fails it whole (ENOENT), and then each goes alone.
      const all = await this.remove(sets).catch((e: NodeJS.ErrnoException) => e);
      if (!(all instanceof Error)) continue;
      for (const one of sets) {
        const r = await this.remove([one]).catch((e: NodeJS.ErrnoException) => e);
        if (r instanceof Error && !isMissing(r)) throw r;
      }
    }
  }

  private async remove(sets: { set: string; keys: Buffer[] }[]): Promise<void> {
    if (sets.length === 0) return;
    const done = await nftElements({ family: FAMILY_BRIDGE, table: this.table, sets, delete: true });
    if (done) return;
    const p = (set: string, key: Buffer) => portOfKey(set, key);
    const res = await run(['nft', '-f', '-'], {
      input: sets.flatMap(({ set, keys }) => keys.map((k) => `delete element bridge ${this.table} ${set} { ${textOf(set, p(set, k))} }`)).join('\n') + '\n',
      allowFailure: true,
    });
    if (res.exitCode !== 0) throw Object.assign(new CommandError(['nft', 'delete', 'element'], res.exitCode, res.stdout, res.stderr), /No such file/i.test(res.stderr) ? { code: 'ENOENT' } : {});
  }

  /** What the sets hold: the guarded veths, and each veth's MACs and addresses. */
  async elements(): Promise<Held> {
    return elementsOf((await this.read()) ?? []);
  }
}

/** What a port guard's sets hold: the guarded veths, and each veth's MACs and addresses. */
export interface Held {
  ports: Set<string>;
  macs: Map<string, string[]>;
  addrs: Map<string, string[]>;
}

function elementsOf(objs: NftObject[]): Held {
  const of = (name: string) => objs.find((o) => o.set?.name === name)?.set?.elem ?? [];
  const ports = new Set(of('ports').filter((e): e is string => typeof e === 'string'));
  const pairs = (name: string) => {
    const out = new Map<string, string[]>();
    for (const e of of(name)) {
      const c = (e as { concat?: unknown[] })?.concat;
      if (Array.isArray(c) && typeof c[0] === 'string' && typeof c[1] === 'string') out.set(c[0], [...(out.get(c[0]) ?? []), c[1]]);
    }
    return out;
  };
  return { ports, macs: pairs('macs'), addrs: pairs('addrs') };
}

/** The parts of `nft -j list table` read here. */
interface NftObject {
  set?: { name: string; type: unknown; elem?: unknown[] };
  rule?: { chain: string; comment?: string };
}

function check(port: BoxPort): void {
  if (!IFNAME_RE.test(port.veth) || !MAC_RE.test(port.mac) || !IPV4_RE.test(port.address)) throw new Error(`bad port ${JSON.stringify(port)}`);
}

const isMissing = (e: NodeJS.ErrnoException) => e.code === 'ENOENT';

/** An ifname key: 16 bytes, NUL-padded (IFNAMSIZ). */
function ifnameKey(name: string): Buffer {
  const b = Buffer.alloc(16);
  b.write(name, 'ascii');
  return b;
}

/** The keys of a port in each set, laid out as nft lays out a concatenation (each field padded
 *  to 4 bytes: a MAC takes 8). A field that is unknown ('') has no key. */
function keysOf(port: BoxPort): { set: string; keys: Buffer[] }[] {
  const ifn = ifnameKey(port.veth);
  const mac = MAC_RE.test(port.mac) ? Buffer.concat([Buffer.from(port.mac.split(':').map((x) => parseInt(x, 16))), Buffer.alloc(2)]) : null;
  const ip = IPV4_RE.test(port.address) ? Buffer.from(port.address.split('.').map(Number)) : null;
  return [
    { set: 'ports', keys: [ifn] },
    { set: 'macs', keys: mac ? [Buffer.concat([ifn, mac])] : [] },
    { set: 'addrs', keys: ip ? [Buffer.concat([ifn, ip])] : [] },
  ];
}

/** A key read back into the port it was made of (for the `nft` fallback). */
function portOfKey(set: string, key: Buffer): BoxPort {
  const veth = key.subarray(0, 16).toString('ascii').replace(/\0+$/, '');
  if (set === 'macs') return { veth, mac: [...key.subarray(16, 22)].map((b) => b.toString(16).padStart(2, '0')).join(':'), address: '' };
  if (set === 'addrs') return { veth, mac: '', address: [...key.subarray(16, 20)].join('.') };
  return { veth, mac: '', address: '' };
}

/** An element as `nft` reads it. */
function textOf(set: string, port: BoxPort): string {
  if (set === 'macs') return `"${port.veth}" . ${port.mac}`;
  if (set === 'addrs') return `"${port.veth}" . ${port.address}`;
  return `"${port.veth}"`;
}
