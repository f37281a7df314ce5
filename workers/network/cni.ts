import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { CommandError, run } from '../../core/command';
import { defaultProjectPrefix, NetLayout } from '../../core/netblocks';
import type { DriverLogger, NetworkAttachment, NetworkDriver, ProjectNetwork } from '../drivers';
import { SourceRules } from './sourceRules';
import { HostChains, outboundRefusals } from './firewall';
import { BoxLinks, CNI_PLUGIN_DIR } from './links';
import { ensureNetnsDir } from '../runtime/netnsDir';
import { checkLayout, LayoutState, lockLayout } from './layoutLock';
import { assertSubnetFree } from './subnetClash';
import { BoxPort, IFNAME_RE, MAC_RE, PortGuard } from './portGuard';

const NETNS_DIR = '/run/netns';
/** A release takes milliseconds; a mark older than this was left by a process that died. */
const RELEASE_MARK_TTL_MS = 60_000;

export interface CniNetworkOptions {
  dataDir: string;
  hostTag: string;
  /** BOXHOST_BOX_SUBNET: project `index` gets the index-th block of `projectPrefix` in it, its
   *  first address as gateway (core/netblocks.ts). */
  boxSubnet: string;
  /** BOXHOST_PROJECT_PREFIX (default: /22, or the subnet's own prefix when narrower). */
  projectPrefix?: number;
  /** NAT boxes out through the host (BOXHOST_BOX_OUTBOUND). */
  outbound: boolean;
  /**
   * Destinations boxes never reach even with `outbound` (IPv4 addresses or CIDRs): the
   * platform's Redis and PostgreSQL, other nodes' agents. A function, because these come from
   * resolving host names: `init` asks it once per start, and only when `outbound` is on
   * (without outbound nothing leaves the host anyway). IPv6 entries are skipped: no IPv6 is
   * routed out of a box bridge at all.
   */
  protectedDestinations?: () => Promise<string[]>;
  logger?: DriverLogger;
  cniPath?: string;
}

const BOX_ID_RE = /^[a-z0-9]{1,32}$/;
const IPV4_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
/**
 * One Linux bridge per project, joined through the CNI `bridge` + `host-local` plugins (and
 * `loopback`), called directly. Isolation is done with iptables chains of this host tag:
 *
 * - INPUT from any of this host's bridges: only replies (ESTABLISHED,RELATED) are accepted, so
 *   a box can never open a connection to the host, while the host (the publish proxy) can
 *   still connect into a box.
 * - FORWARD: bridged traffic (boxes on the same bridge, br_netfilter on) is accepted; routed
 *   traffic between two project bridges is dropped; traffic out of the host only when
 *   `outbound` (then masqueraded), and even then never to link-local (cloud metadata), the box
 *   subnet elsewhere, nor the protected destinations (chain `-OUT`); else dropped.
 * - Spoofing, three layers deep. Per box, the port guard (`portGuard.ts`: set elements keyed on
 *   its host-side veth, table `bridge boxhost_<tag>`) lets out only frames with its own MAC,
 *   IPv4 from its own address and ARP claiming its own MAC and address; it is the bridge
 *   plugin's `macspoofchk` and more (that one runs `nft` inside every ADD, for a subset). Per
 *   bridge, an iptables rule (chain `-SRC`, first in INPUT and FORWARD) drops what does not
 *   come from the project's block, and `rp_filter=1` does the same for what is routed.
 * - The layout (subnet and project prefix) is recorded at the first `init` and held while any
 *   box has an address under it (`layoutLock.ts`).
 * - IPv6 is off on the bridges, and ip6tables drops the rest.
 */
export class CniNetwork implements NetworkDriver {
  readonly dataDir: string;
  readonly hostTag: string;
  readonly outbound: boolean;
  /** How the box subnet is cut into project blocks. */
  readonly layout: NetLayout;
  private readonly cniPath: string;
  private readonly ipamDir: string;
  private readonly releaseDir: string;
  private readonly protectedDestinations: () => Promise<string[]>;
  private readonly logger?: DriverLogger;
  /** The iptables chains of this tag, and their names (firewall.ts). */
  readonly chains: HostChains;
  private readonly guard: PortGuard;
  /** Each box's eth0 and loopback (links.ts). */
  private readonly links: BoxLinks;

  constructor(opts: CniNetworkOptions) {
    if (!/^[a-z0-9]{4,16}$/.test(opts.hostTag)) throw new Error(`invalid host tag ${opts.hostTag}`);
    this.layout = new NetLayout(opts.boxSubnet, opts.projectPrefix ?? defaultProjectPrefix(opts.boxSubnet));
    this.dataDir = path.resolve(opts.dataDir);
    this.hostTag = opts.hostTag;
    this.outbound = opts.outbound;
    this.cniPath = opts.cniPath ?? CNI_PLUGIN_DIR;
    this.ipamDir = path.join(this.dataDir, 'cni', 'ipam');
    this.releaseDir = path.join(this.dataDir, 'cni', 'releasing');
    this.protectedDestinations = opts.protectedDestinations ?? (async () => []);
    this.logger = opts.logger;
    this.guard = new PortGuard(this.portTable, this.logger);
    this.chains = new HostChains(this.hostTag, this.logger);
    this.links = new BoxLinks({ layout: this.layout, ipamDir: this.ipamDir, cniPath: this.cniPath, names: this });
  }

  // ---------------------------------------------------------------- naming

  get boxSubnet(): string {
    return this.layout.subnet;
  }

  /** Interface-name prefix of all this host's bridges (iptables wildcard `<prefix>+`). */
  get bridgePrefix(): string {
    return `bh${this.hostTag.slice(0, 4)}p`;
  }

  bridgeName(index: number): string {
    this.checkIndex(index);
    return `${this.bridgePrefix}${index}`;
  }

  /** CNI network name (also the host-local state directory name). */
  networkName(index: number): string {
    this.checkIndex(index);
    return `bh${this.hostTag}p${index}`;
  }

  /** The project's block (`a.b.c.d/p`). */
  subnet(index: number): string {
    return this.layout.block(index).cidr;
  }

  /** The block's first address: the bridge's own. */
  gateway(index: number): string {
    return this.layout.block(index).gateway;
  }

  private checkIndex(index: number): void {
    if (!this.layout.has(index)) throw new Error(`project network index must be 0…${this.layout.maxProjects - 1} (${this.layout.describe()}), not ${index}`);
  }

  netnsName(boxId: string): string {
    if (!BOX_ID_RE.test(boxId)) throw new Error(`invalid box id ${JSON.stringify(boxId)}`);
    return `bh${this.hostTag}-${boxId}`;
  }

  netnsPath(boxId: string): string {
    return path.join(NETNS_DIR, this.netnsName(boxId));
  }

  private get sourceRules(): SourceRules {
    return new SourceRules(() => this.chains.iptables(), this.chains.chainPkg);
  }

  /** The nftables table (family bridge) of the port guard (`portGuard.ts`). */
  get portTable(): string {
    return `boxhost_${this.hostTag}`;
  }

  /**
   * Host-wide set-up: sysctls, this tag's firewall chains and port table. Idempotent and cheap
   * on a live host: each chain is compared with what it should hold and rewritten only on a
   * difference. It also repairs what a live host may lack (bridges and boxes made by an older
   * version, a ruleset flushed by hand): the source rule and sysctls of every live bridge, the
   * port guard of every attached box; and drops those of bridges and ports that are gone.
   */
  async init(): Promise<void> {
    this.guarded.clear();
    await fs.promises.mkdir(this.ipamDir, { recursive: true, mode: 0o700 });
    await ensureNetnsDir(NETNS_DIR, (msg) => this.logger?.warn({}, msg));
    await this.lockLayout();
    // Before anything is wired: a subnet another interface routes would put two gateways on one
    // address (docs/configuration.md BOXHOST_BOX_SUBNET).
    await assertSubnetFree(this.boxSubnet, this.bridgePrefix, this.logger);
    // Bridged (same-bridge) traffic must pass iptables for the physdev rule to see it; and
    // forwarding must be on for outbound NAT (the bridge plugin turns it on anyway).
    await writeSysctl('/proc/sys/net/bridge/bridge-nf-call-iptables', '1', this.logger);
    await writeSysctl('/proc/sys/net/bridge/bridge-nf-call-ip6tables', '1', this.logger);
    if (this.outbound) await writeSysctl('/proc/sys/net/ipv4/ip_forward', '1', this.logger);

    await this.syncBridgeRules(await this.chains.iptables());
    const refusals = async () => outboundRefusals(this.boxSubnet, await this.protectedDestinations(), this.logger);
    await this.chains.write({ bridgePrefix: this.bridgePrefix, boxSubnet: this.boxSubnet, outbound: this.outbound, refusals });

    await this.syncPortTable();
  }

  /** The source check of one project bridge, in `iptables -S` form. */
  private bridgeRule(index: number): string[] {
    return ['!', '-s', this.subnet(index), '-i', this.bridgeName(index), '-j', 'DROP'];
  }

  /**
   * Makes `-SRC` hold exactly one rule per live bridge of this host, adding and deleting
   * single rules (never a flush): workers attach and release concurrently with a node's init.
   * Rules are read before bridges are listed, since a rule is only ever added once its bridge
   * exists: a rule read here whose bridge is then missing belongs to a released bridge.
   */
  private async syncBridgeRules(ipt: string): Promise<void> {
    await this.chains.makeChain(ipt, 'filter', this.chains.chainSrc);
    const have = (await this.chains.chainRules(ipt, 'filter', this.chains.chainSrc)) ?? [];
    const live = await this.liveBridges();
    const want = new Set(live.map((i) => this.bridgeRule(i).join(' ')));
    const kept = new Set<string>();
    for (const rule of have) {
      if (want.has(rule) && !kept.has(rule)) kept.add(rule);
      else await run([ipt, '-w', '-t', 'filter', '-D', this.chains.chainSrc, ...rule.split(' ')], { allowFailure: true });
    }
    for (const i of live) {
      if (!kept.has(this.bridgeRule(i).join(' '))) await run([ipt, '-w', '-t', 'filter', '-A', this.chains.chainSrc, ...this.bridgeRule(i)]);
      await this.bridgeSysctls(i);
    }
  }

  /** Project indexes whose bridge exists and was made by this data dir (it has IPAM state:
   *  the bridge-name prefix holds only 4 characters of the tag). */
  private async liveBridges(): Promise<number[]> {
    const out: number[] = [];
    for (const i of await this.ipamIndexes()) {
      if (this.layout.has(i) && (await exists(`/sys/class/net/${this.bridgeName(i)}`))) out.push(i);
    }
    return out.sort((a, b) => a - b);
  }

  /** Indexes of every project network with IPAM state in this data dir, of this layout or not
   *  (`destroyAll` and a layout change remove them all). */
  private async ipamIndexes(): Promise<number[]> {
    const re = new RegExp(`^bh${this.hostTag}p(\\d{1,7})$`);
    const names = await fs.promises.readdir(this.ipamDir).catch(() => [] as string[]);
    return names.map((n) => re.exec(n)).filter((m): m is RegExpExecArray => m !== null).map((m) => Number(m[1]));
  }

  /** Every address host-local has leased in this data dir, whatever the layout. */
  private async leasedAddresses(): Promise<string[]> {
    const out: string[] = [];
    const names = await fs.promises.readdir(this.ipamDir).catch(() => [] as string[]);
    for (const n of names.filter((x) => x.startsWith(`bh${this.hostTag}p`))) {
      for (const f of await fs.promises.readdir(path.join(this.ipamDir, n)).catch(() => [] as string[])) if (IPV4_RE.test(f)) out.push(f);
    }
    return out;
  }

  /** The layout lock (`layoutLock.ts`): recorded at the first init, held while a box holds an
   *  address. Also the check a process that never ran init makes before its first attach. */
  private lockLayout(): Promise<void> {
    this.layoutChecked = lockLayout(this.dataDir, this.layout, this.layoutState(), this.logger);
    return this.layoutChecked;
  }

  private checkLayout(): Promise<void> {
    this.layoutChecked ??= checkLayout(this.dataDir, this.layout, this.layoutState()).catch((e: unknown) => {
      this.layoutChecked = undefined;
      throw e;
    });
    return this.layoutChecked;
  }

  /** Settled once the recorded layout was found to agree with this driver's. */
  private layoutChecked?: Promise<void>;

  private layoutState(): LayoutState {
    return {
      leased: () => this.leasedAddresses(),
      // Nothing is addressed: bridges and state left of an earlier layout go (the bridges
      // still carry its gateway addresses and routes).
      dropAll: async () => {
        for (const i of await this.ipamIndexes()) {
          await run(['ip', 'link', 'delete', `${this.bridgePrefix}${i}`, 'type', 'bridge'], { allowFailure: true });
          await fs.promises.rm(path.join(this.ipamDir, `bh${this.hostTag}p${i}`), { recursive: true, force: true });
        }
      },
    };
  }

  /** No IPv6 on a bridge; strict reverse-path filtering: a packet routed from a bridge must
   *  come from that bridge's block. */
  private async bridgeSysctls(index: number): Promise<void> {
    const name = this.bridgeName(index);
    await writeSysctl(`/proc/sys/net/ipv6/conf/${name}/disable_ipv6`, '1', this.logger);
    await writeSysctl(`/proc/sys/net/ipv4/conf/${name}/rp_filter`, '1', this.logger);
  }

  /** Everything a bridge needs beyond what the plugin makes. Idempotent. */
  /** Bridges this process has guarded (sysctls and source rule in place), by the bridge's
   *  ifindex: a box joining the same bridge again costs no iptables call, while a bridge that
   *  was released (by any process) and made anew has a new ifindex and is guarded again. */
  private readonly guarded = new Map<number, string>();

  private async guardBridge(index: number): Promise<void> {
    const ifindex = (await fs.promises.readFile(`/sys/class/net/${this.bridgeName(index)}/ifindex`, 'utf8').catch(() => '')).trim();
    if (ifindex && this.guarded.get(index) === ifindex) return;
    await this.bridgeSysctls(index);
    const ipt = await this.chains.iptables();
    const rule = this.bridgeRule(index);
    const check = await run([ipt, '-w', '-t', 'filter', '-C', this.chains.chainSrc, ...rule], { allowFailure: true });
    if (check.exitCode !== 0) await run([ipt, '-w', '-t', 'filter', '-A', this.chains.chainSrc, ...rule]);
    if (ifindex) this.guarded.set(index, ifindex);
  }

  // ---------------------------------------------------------------- port guards

  /**
   * The port guard's table, made or repaired; then every attached box that is not guarded gets
   * its guard back (`attachedPorts`), and elements of veths that are gone are dropped. The elements
   * are read before the netns list, since a box's netns exists before its guard and outlives it.
   * A veth that still exists keeps its elements: it is some box's live port (one joining now,
   * whose mark is not written yet).
   */
  private async syncPortTable(): Promise<void> {
    // A table written anew (none, or of another layout) gets every attached box's port in the
    // same transaction.
    await this.guard.ensure(async () => (await this.attachedPorts()).map((a) => a.port));
    const held = await this.guard.elements();
    for (const { id, port, marked } of await this.attachedPorts()) {
      if (!held.ports.has(port.veth)) {
        await this.guard.guard(port);
        this.logger?.info({ boxId: id, port }, 'port guard restored');
      }
      // An attached box's mark names its port in full from now on.
      if (!marked && (await exists(this.attachedMark(id)))) await this.writeMark(id, port);
    }
    for (const veth of new Set([...held.ports, ...held.macs.keys(), ...held.addrs.keys()])) {
      if (!(await exists(`/sys/class/net/${veth}`))) await this.guard.unguard({ veth }).catch((e) => this.logger?.warn({ veth, err: String(e) }, 'stale port guard not removed'));
    }
  }

  /**
   * The ports of the boxes attached here: as their marks name them (`marked`), else (a mark of an
   * older version, or a veth that is not there) as their interfaces and leases are (`livePort`).
   */
  private async attachedPorts(): Promise<{ id: string; port: BoxPort; marked: boolean }[]> {
    const ports: { id: string; port: BoxPort; marked: boolean }[] = [];
    let leases: Map<string, string> | undefined;
    for (const id of await this.listAttached()) {
      const mark = await this.readMark(id);
      if (mark.veth && mark.mac && mark.address && (await exists(`/sys/class/net/${mark.veth}`))) {
        ports.push({ id, port: { veth: mark.veth, mac: mark.mac, address: mark.address }, marked: true });
        continue;
      }
      leases ??= await this.leases();
      const port = await this.livePort(id, leases).catch(() => null);
      if (port) ports.push({ id, port, marked: false });
    }
    return ports;
  }

  /**
   * Takes a half-made attach's eth0 away, then its guard: the veth is found first (its mark, or
   * else the veth its eth0 is paired with: a port guarded by a worker that died before writing
   * the mark), and is gone before its guard is, never up and unguarded (as in `detach`).
   */
  private async dropPort(boxId: string, index: number, known?: BoxPort): Promise<void> {
    let port: Pick<BoxPort, 'veth'> & Partial<BoxPort> | undefined = known;
    if (!port) {
      const mark = await this.readMark(boxId);
      const veth = mark.veth ?? (await this.peerVeth(boxId).catch(() => undefined));
      if (veth) port = { veth, mac: mark.mac, address: mark.address };
    }
    const removed = await this.links.delEth0(boxId, index).then(
      () => true,
      () => false,
    );
    // An eth0 that could not be taken away keeps its guard (the next init looks again).
    if (port && (removed || !(await exists(`/sys/class/net/${port.veth}`)))) await this.guard.unguard(port);
  }

  /** The host-side veth the box's eth0 is paired with; undefined without one. */
  private async peerVeth(boxId: string): Promise<string | undefined> {
    const eth0 = await this.eth0(boxId);
    if (eth0.peerIndex === null) return undefined;
    const links = JSON.parse((await run(['ip', '-j', 'link', 'show', 'type', 'veth'])).stdout) as { ifindex: number; ifname: string }[];
    return links.find((l) => l.ifindex === eth0.peerIndex)?.ifname;
  }

  /**
   * The port of a box attached without its guard (by an older version, or by a worker that
   * died before making it): veth and MAC as its interfaces are now, the address from its
   * lease, not from eth0. Null when it has no eth0 or no lease (made by `prepare`, not
   * attached yet).
   */
  private async livePort(boxId: string, leases: Map<string, string>): Promise<BoxPort | null> {
    const address = leases.get(boxId);
    const eth0 = await this.eth0(boxId);
    if (!address || !eth0.mac || eth0.peerIndex === null) return null;
    const veth = await this.peerVeth(boxId);
    return veth ? { veth, mac: eth0.mac, address } : null;
  }

  /** Box id → the address host-local leased it: each lease is a file named by the address,
   *  holding the CNI container id (the netns name) and the interface. */
  private async leases(): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    const prefix = `bh${this.hostTag}-`;
    for (const i of (await this.ipamIndexes()).filter((x) => this.layout.has(x))) {
      const dir = path.join(this.ipamDir, this.networkName(i));
      for (const name of await fs.promises.readdir(dir).catch(() => [] as string[])) {
        if (!IPV4_RE.test(name)) continue;
        const [cid] = (await fs.promises.readFile(path.join(dir, name), 'utf8').catch(() => '')).split(/\r?\n/);
        if (cid.startsWith(prefix)) out.set(cid.slice(prefix.length), name);
      }
    }
    return out;
  }

  // ---------------------------------------------------------------- netns and attachment

  private async netnsExists(boxId: string): Promise<boolean> {
    return exists(this.netnsPath(boxId));
  }

  /** The box's eth0: whether it exists, its IPv4 address within this host's box subnet, its
   *  MAC and the ifindex of its veth peer on the host. */
  private async eth0(boxId: string): Promise<{ present: boolean; address: string | null; mac: string | null; peerIndex: number | null }> {
    const res = await run(['ip', '-n', this.netnsName(boxId), '-j', 'addr', 'show', 'dev', 'eth0'], { allowFailure: true });
    if (res.exitCode !== 0) return { present: false, address: null, mac: null, peerIndex: null };
    try {
      const [l] = JSON.parse(res.stdout) as { address?: string; link_index?: number; addr_info?: { family: string; local: string }[] }[];
      const address = l?.addr_info?.find((a) => a.family === 'inet' && this.layout.inSubnet(a.local))?.local ?? null;
      return { present: true, address, mac: l?.address ?? null, peerIndex: l?.link_index ?? null };
    } catch {
      return { present: true, address: null, mac: null, peerIndex: null };
    }
  }

  /** Makes the box's (empty) netns, so a container can be created in it while `attach` wires
   *  it up at the same time. Idempotent. */
  async prepare(boxId: string): Promise<string> {
    if (!(await this.netnsExists(boxId))) {
      const res = await run(['ip', 'netns', 'add', this.netnsName(boxId)], { allowFailure: true });
      if (res.exitCode !== 0 && !/exists/i.test(res.stderr)) throw new CommandError(['ip', 'netns', 'add', this.netnsName(boxId)], res.exitCode, res.stdout, res.stderr);
    }
    return this.netnsPath(boxId);
  }

  async attach(boxId: string, net: ProjectNetwork, opts: { loopbackUp?: boolean } = {}): Promise<NetworkAttachment> {
    await this.checkLayout();
    const index = net.index;
    const gateway = this.gateway(index);
    const netnsPath = this.netnsPath(boxId);
    // A netns this driver never finished attaching (no mark) goes straight to ADD: probing its
    // eth0 costs a process per create. One that a worker left half-way through its ADD makes
    // that ADD fail, which undoes it, and the job's retry attaches.
    if ((await this.netnsExists(boxId)) && (await exists(this.attachedMark(boxId)))) {
      const eth0 = await this.eth0(boxId);
      if (eth0.address && this.layout.holds(index, eth0.address)) {
        const lo = await run(['ip', '-n', this.netnsName(boxId), '-j', 'link', 'show', 'dev', 'lo'], { allowFailure: true });
        // The mark is written after the port chain: an attached box with its mark is guarded.
        if (lo.stdout.includes('"UP"') || lo.stdout.includes('LOWER_UP')) return { netnsPath, address: eth0.address, gateway };
        // Attached, with lo down: root in the box took it down (its netns outlives a stop). Up
        // again, whatever made the netns; eth0 and the address stay as they are.
        if (lo.exitCode === 0) {
          await this.links.loopbackUp(boxId);
          return { netnsPath, address: eth0.address, gateway };
        }
      }
      // Half made (a worker died mid-way): undo and start over. A netns that `prepare` made
      // has no eth0 yet and goes straight to ADD.
      if (eth0.present) await this.dropPort(boxId, index);
    } else {
      await this.prepare(boxId);
    }
    await fs.promises.mkdir(this.ipamDir, { recursive: true, mode: 0o700 });
    const t0 = Date.now();
    let guarded: BoxPort | undefined;
    try {
      // lo and eth0 are independent interfaces of the netns: brought up side by side (lo only
      // when the runtime did not make the netns with it up).
      const [, port] = await Promise.all([opts.loopbackUp ? null : this.links.loopbackUp(boxId), this.links.addEth0(boxId, index)]);
      await this.checkBridgeKept(index, port.veth);
      await this.guardBridge(index);
      const address = port.address;
      guarded = port;
      await this.guard.guard(guarded);
      await this.writeMark(boxId, guarded);
      this.logger?.debug({ boxId, index, ms: Date.now() - t0 }, 'cni add');
      return { netnsPath, address, gateway };
    } catch (e) {
      // Undo the plugins' work but keep the netns: the container may already be in it
      // (BoxSteps starts it side by side), and the retry joins that same netns again.
      // Its guard too, while the veth is there to be found (an earlier try's, left by a worker
      // that died before writing the mark, is keyed on the veth eth0 still has).
      await this.dropPort(boxId, index, guarded).catch(() => undefined);
      throw e;
    }
  }

  /**
   * Fails the attach when `releaseProject` may have removed the bridge under it: the release
   * marks itself before it looks for ports, so either it sees this box's veth (and keeps the
   * bridge), or this check, made after the veth joined, sees its mark or the veth already
   * without its bridge. The mark is looked at first: a release that ends between the two
   * looks leaves the veth without its bridge by the second. The job retries and makes the
   * bridge again.
   */
  private async checkBridgeKept(index: number, veth: string): Promise<void> {
    const released = () => new Error(`project network ${index} was being released while a box joined it; try again`);
    if (await this.releasing(index)) throw released();
    const master = await fs.promises.readlink(`/sys/class/net/${veth}/master`).catch(() => '');
    if (path.basename(master) !== this.bridgeName(index)) throw released();
  }

  private async releasing(index: number): Promise<boolean> {
    const names = await fs.promises.readdir(this.releaseDir).catch(() => [] as string[]);
    for (const n of names) {
      if (!n.startsWith(`${index}-`)) continue;
      const st = await fs.promises.stat(path.join(this.releaseDir, n)).catch(() => null);
      if (st && Date.now() - st.mtimeMs < RELEASE_MARK_TTL_MS) return true;
    }
    return false;
  }

  /** Written once a box is attached and guarded (its address, host-side veth and MAC, a line
   *  each); removed by its detach. */
  private attachedMark(boxId: string): string {
    return path.join(this.dataDir, 'cni', 'attached', boxId);
  }

  private async writeMark(boxId: string, port: BoxPort): Promise<void> {
    await fs.promises.mkdir(path.dirname(this.attachedMark(boxId)), { recursive: true, mode: 0o700 });
    await fs.promises.writeFile(this.attachedMark(boxId), `${port.address}\n${port.veth}\n${port.mac}\n`, { mode: 0o600 });
  }

  /** What the box's mark names; a field is undefined without a mark, or for a mark of an older
   *  version (the address alone, or without the MAC). */
  private async readMark(boxId: string): Promise<{ address?: string; veth?: string; mac?: string }> {
    const [address, veth, mac] = (await fs.promises.readFile(this.attachedMark(boxId), 'utf8').catch(() => '')).split('\n');
    return { address: address || undefined, veth: veth && IFNAME_RE.test(veth) ? veth : undefined, mac: mac && MAC_RE.test(mac) ? mac : undefined };
  }

  async detach(boxId: string, net: ProjectNetwork): Promise<void> {
    const t0 = Date.now();
    const mark = await this.readMark(boxId);
    // A port guarded by a worker that died before its mark: found from eth0 while it is there.
    const veth = mark.veth ?? (await this.peerVeth(boxId));
    // Before DEL frees the address: a box given it next must not inherit a build's opening.
    await this.sourceRules.close(boxId);
    await fs.promises.rm(this.attachedMark(boxId), { force: true });
    // DEL works (and frees the address) whether or not the netns is still there. A network
    // outside the layout holds no lease (the layout lock): nothing to free.
    if (this.layout.has(net.index)) await this.links.delEth0(boxId, net.index);
    // After DEL: the veth is gone, so dropping its guard opens nothing.
    if (veth) await this.guard.unguard({ veth, mac: mark.mac, address: mark.address });
    const res = await run(['ip', 'netns', 'delete', this.netnsName(boxId)], { allowFailure: true });
    if (res.exitCode !== 0 && (await this.netnsExists(boxId))) {
      throw new CommandError(['ip', 'netns', 'delete', this.netnsName(boxId)], res.exitCode, res.stdout, res.stderr);
    }
    this.logger?.debug({ boxId, ms: Date.now() - t0 }, 'cni del');
  }

  async openSources(boxId: string, address: string, port: number): Promise<string> {
    if (!BOX_ID_RE.test(boxId)) throw new Error(`invalid box id ${boxId}`);
    const index = this.layout.indexOf(address);
    if (index === null) throw new Error(`box address ${address} is not in ${this.boxSubnet}`);
    const gateway = this.gateway(index);
    await this.sourceRules.open(boxId, address, gateway, port);
    return gateway;
  }

  async closeSources(boxId: string): Promise<void> {
    if (!BOX_ID_RE.test(boxId)) throw new Error(`invalid box id ${boxId}`);
    await this.sourceRules.close(boxId);
  }

  /** Boxes with package-source rules (for tests). */
  sourceBoxes(): Promise<string[]> {
    return this.sourceRules.boxes();
  }

  async listAttached(): Promise<string[]> {
    let names: string[];
    try {
      names = await fs.promises.readdir(NETNS_DIR);
    } catch {
      return [];
    }
    const prefix = `bh${this.hostTag}-`;
    return names
      .filter((n) => n.startsWith(prefix))
      .map((n) => n.slice(prefix.length))
      .filter((id) => BOX_ID_RE.test(id))
      .sort();
  }

  /**
   * Removes a project's bridge, its source rule and its IPAM state once no port is left on it.
   * Idempotent; answers false (and changes nothing) while a box is on it. The mark it leaves
   * while it works is what a concurrent `attach` checks (`checkBridgeKept`).
   */
  async releaseProject(net: ProjectNetwork): Promise<boolean> {
    // Outside the layout: the layout lock removed its bridge and state when the layout changed.
    if (!this.layout.has(net.index)) return true;
    const name = this.bridgeName(net.index);
    await fs.promises.mkdir(this.releaseDir, { recursive: true, mode: 0o700 });
    const mark = path.join(this.releaseDir, `${net.index}-${process.pid}-${crypto.randomBytes(4).toString('hex')}`);
    await fs.promises.writeFile(mark, '');
    try {
      // The bridge's ports, from sysfs: no process, and no listing of every link on the host.
      const ports = await fs.promises.readdir(`/sys/class/net/${name}/brif`).catch(() => [] as string[]);
      if (ports.length > 0) return false;
      const del = await run(['ip', 'link', 'delete', name, 'type', 'bridge'], { allowFailure: true });
      if (del.exitCode !== 0 && (await exists(`/sys/class/net/${name}`))) throw new CommandError(['ip', 'link', 'delete', name], del.exitCode, del.stdout, del.stderr);
      const ipt = await this.chains.iptables();
      for (let i = 0; i < 20; i++) {
        const res = await run([ipt, '-w', '-t', 'filter', '-D', this.chains.chainSrc, ...this.bridgeRule(net.index)], { allowFailure: true });
        if (res.exitCode !== 0) break;
      }
      await fs.promises.rm(path.join(this.ipamDir, this.networkName(net.index)), { recursive: true, force: true });
      this.guarded.delete(net.index);
      return true;
    } finally {
      await fs.promises.rm(mark, { force: true });
    }
  }

  /** Removes everything of this host tag: netns, bridges, firewall chains, port table, IPAM
   *  state. */
  async destroyAll(): Promise<void> {
    for (const boxId of await this.listAttached()) {
      await run(['ip', 'netns', 'delete', this.netnsName(boxId)], { allowFailure: true });
    }
    // Bridges this data dir made (named by its IPAM state).
    for (const i of await this.ipamIndexes()) {
      await run(['ip', 'link', 'delete', `${this.bridgePrefix}${i}`, 'type', 'bridge'], { allowFailure: true });
    }
    await this.chains.removeAll(this.bridgePrefix);
    await this.guard.drop().catch((e) => this.logger?.warn({ err: String(e) }, 'port guard table not removed'));
    this.guarded.clear();
    await fs.promises.rm(path.join(this.dataDir, 'cni'), { recursive: true, force: true });
  }
}

async function exists(p: string): Promise<boolean> {
  try {
    await fs.promises.access(p);
    return true;
  } catch {
    return false;
  }
}

async function writeSysctl(file: string, value: string, logger?: DriverLogger): Promise<void> {
  try {
    const cur = (await fs.promises.readFile(file, 'utf8')).trim();
    if (cur === value) return;
    await fs.promises.writeFile(file, value);
  } catch (e) {
    logger?.warn({ file, err: String(e) }, 'sysctl not set');
  }
}
