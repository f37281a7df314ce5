import fs from 'node:fs';
import path from 'node:path';
import { CommandError, run } from '../../core/command';
import type { DriverLogger, NetworkAttachment, NetworkDriver, ProjectNetwork } from '../drivers';

export const CNI_PLUGIN_DIR = '/usr/lib/cni';
export const CNI_VERSION = '1.0.0';
const NETNS_DIR = '/run/netns';

export interface CniNetworkOptions {
  dataDir: string;
  hostTag: string;
  /** `a.b.0.0/16`; project `index` gets `a.b.<index>.0/24`, gateway `.1`. */
  boxSubnet: string;
  /** NAT boxes out through the host (BOXHOST_BOX_OUTBOUND). */
  outbound: boolean;
  logger?: DriverLogger;
  cniPath?: string;
}

const BOX_ID_RE = /^[a-z0-9]{1,32}$/;

/**
 * One Linux bridge per project, joined through the CNI `bridge` + `host-local` plugins (and
 * `loopback`), called directly. Isolation is done with iptables chains of this host tag:
 *
 * - INPUT from any of this host's bridges: only replies (ESTABLISHED,RELATED) are accepted, so
 *   a box can never open a connection to the host, while the host (the publish proxy) can
 *   still connect into a box.
 * - FORWARD: bridged traffic (boxes on the same bridge, br_netfilter on) is accepted; routed
 *   traffic between two project bridges is dropped; traffic out of the host only when
 *   `outbound` (then masqueraded), else dropped.
 * - IPv6 is off on the bridges, and ip6tables drops the rest.
 */
export class CniNetwork implements NetworkDriver {
  readonly dataDir: string;
  readonly hostTag: string;
  readonly outbound: boolean;
  private readonly prefix16: [number, number];
  private readonly cniPath: string;
  private readonly ipamDir: string;
  private readonly logger?: DriverLogger;
  private iptablesBin?: string;
  private ip6tablesBin?: string | null;

  constructor(opts: CniNetworkOptions) {
    if (!/^[a-z0-9]{4,16}$/.test(opts.hostTag)) throw new Error(`invalid host tag ${opts.hostTag}`);
    const m = /^(\d{1,3})\.(\d{1,3})\.0\.0\/16$/.exec(opts.boxSubnet);
    if (!m || Number(m[1]) > 255 || Number(m[2]) > 255) throw new Error(`box subnet must be an IPv4 /16 like 10.88.0.0/16, not ${opts.boxSubnet}`);
    this.prefix16 = [Number(m[1]), Number(m[2])];
    this.dataDir = path.resolve(opts.dataDir);
    this.hostTag = opts.hostTag;
    this.outbound = opts.outbound;
    this.cniPath = opts.cniPath ?? CNI_PLUGIN_DIR;
    this.ipamDir = path.join(this.dataDir, 'cni', 'ipam');
    this.logger = opts.logger;
  }

  // ---------------------------------------------------------------- naming

  get boxSubnet(): string {
    return `${this.prefix16[0]}.${this.prefix16[1]}.0.0/16`;
  }

  /** Interface-name prefix of all this host's bridges (iptables wildcard `<prefix>+`). */
  get bridgePrefix(): string {
    return `bh${this.hostTag.slice(0, 4)}p`;
  }

  bridgeName(index: number): string {
    checkIndex(index);
    return `${this.bridgePrefix}${index}`;
  }

  /** CNI network name (also the host-local state directory name). */
  networkName(index: number): string {
    checkIndex(index);
    return `bh${this.hostTag}p${index}`;
  }

  subnet(index: number): string {
    checkIndex(index);
    return `${this.prefix16[0]}.${this.prefix16[1]}.${index}.0/24`;
  }

  gateway(index: number): string {
    checkIndex(index);
    return `${this.prefix16[0]}.${this.prefix16[1]}.${index}.1`;
  }

  netnsName(boxId: string): string {
    if (!BOX_ID_RE.test(boxId)) throw new Error(`invalid box id ${JSON.stringify(boxId)}`);
    return `bh${this.hostTag}-${boxId}`;
  }

  netnsPath(boxId: string): string {
    return path.join(NETNS_DIR, this.netnsName(boxId));
  }

  get chainIn(): string {
    return `BH-${this.hostTag}-IN`;
  }
  get chainFwd(): string {
    return `BH-${this.hostTag}-FWD`;
  }
  get chainNat(): string {
    return `BH-${this.hostTag}-NAT`;
  }

  // ---------------------------------------------------------------- firewall

  private async iptables(): Promise<string> {
    if (this.iptablesBin) return this.iptablesBin;
    // Debian 12 defaults to the nf_tables backend; fall back to legacy where that is broken.
    for (const bin of ['iptables', 'iptables-nft', 'iptables-legacy']) {
      const res = await run([bin, '-w', '-t', 'filter', '-L', 'INPUT', '-n'], { allowFailure: true }).catch(() => null);
      if (res && res.exitCode === 0) return (this.iptablesBin = bin);
    }
    throw new Error('no working iptables found (tried iptables, iptables-nft, iptables-legacy)');
  }

  private async ip6tables(): Promise<string | null> {
    if (this.ip6tablesBin !== undefined) return this.ip6tablesBin;
    const v4 = await this.iptables();
    const bin = v4.replace(/^iptables/, 'ip6tables');
    const res = await run([bin, '-w', '-t', 'filter', '-L', 'INPUT', '-n'], { allowFailure: true }).catch(() => null);
    this.ip6tablesBin = res && res.exitCode === 0 ? bin : null;
    return this.ip6tablesBin;
  }

  /** Host-wide set-up: sysctls and this tag's firewall chains. Idempotent (rules rebuilt). */
  async init(): Promise<void> {
    await fs.promises.mkdir(this.ipamDir, { recursive: true, mode: 0o700 });
    // Bridged (same-bridge) traffic must pass iptables for the physdev rule to see it; and
    // forwarding must be on for outbound NAT (the bridge plugin turns it on anyway).
    await writeSysctl('/proc/sys/net/bridge/bridge-nf-call-iptables', '1', this.logger);
    await writeSysctl('/proc/sys/net/bridge/bridge-nf-call-ip6tables', '1', this.logger);
    if (this.outbound) await writeSysctl('/proc/sys/net/ipv4/ip_forward', '1', this.logger);

    const ipt = await this.iptables();
    const br = `${this.bridgePrefix}+`;
    await this.ensureChain(ipt, 'filter', this.chainIn, [
      ['-m', 'conntrack', '--ctstate', 'ESTABLISHED,RELATED', '-j', 'ACCEPT'],
      ['-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset'],
      ['-j', 'DROP'],
    ]);
    const fwd: string[][] = [
      // Same bridge = same project: bridged, not routed.
      ['-m', 'physdev', '--physdev-is-bridged', '-j', 'ACCEPT'],
      // Routed from one project bridge to another (TCP is reset: callers fail fast).
      ['-i', br, '-o', br, '-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset'],
      ['-i', br, '-o', br, '-j', 'DROP'],
      ['-m', 'conntrack', '--ctstate', 'ESTABLISHED,RELATED', '-j', 'ACCEPT'],
    ];
    if (this.outbound) fwd.push(['-i', br, '!', '-o', br, '-j', 'ACCEPT']);
    fwd.push(['-i', br, '-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset']);
    fwd.push(['-j', 'DROP']);
    await this.ensureChain(ipt, 'filter', this.chainFwd, fwd);
    await this.ensureHook(ipt, 'filter', 'INPUT', ['-i', br, '-j', this.chainIn]);
    await this.ensureHook(ipt, 'filter', 'FORWARD', ['-i', br, '-j', this.chainFwd]);
    await this.ensureHook(ipt, 'filter', 'FORWARD', ['-o', br, '-j', this.chainFwd]);

    if (this.outbound) {
      await this.ensureChain(ipt, 'nat', this.chainNat, [['-s', this.boxSubnet, '!', '-d', this.boxSubnet, '-j', 'MASQUERADE']]);
      await this.ensureHook(ipt, 'nat', 'POSTROUTING', ['-j', this.chainNat]);
    } else {
      await this.removeChain(ipt, 'nat', this.chainNat, [['POSTROUTING', ['-j', this.chainNat]]]);
    }

    const ip6 = await this.ip6tables();
    if (ip6) {
      await this.ensureChain(ip6, 'filter', this.chainIn, [['-j', 'DROP']]);
      await this.ensureChain(ip6, 'filter', this.chainFwd, [['-m', 'physdev', '--physdev-is-bridged', '-j', 'ACCEPT'], ['-j', 'DROP']]);
      await this.ensureHook(ip6, 'filter', 'INPUT', ['-i', br, '-j', this.chainIn]);
      await this.ensureHook(ip6, 'filter', 'FORWARD', ['-i', br, '-j', this.chainFwd]);
      await this.ensureHook(ip6, 'filter', 'FORWARD', ['-o', br, '-j', this.chainFwd]);
    }
  }

  private async ensureChain(bin: string, table: string, chain: string, rules: string[][]): Promise<void> {
    const made = await run([bin, '-w', '-t', table, '-N', chain], { allowFailure: true });
    if (made.exitCode !== 0 && !/exists/i.test(made.stderr)) throw new CommandError([bin, '-t', table, '-N', chain], made.exitCode, made.stdout, made.stderr);
    // Build the wanted rules, then compare with what is there: rewrite only on a difference,
    // so that an init on a live host does not open a window without rules.
    const want = rules.map((r) => r.join(' '));
    const have = await this.chainRules(bin, table, chain);
    if (have !== null && sameRules(have, rules)) return;
    await run([bin, '-w', '-t', table, '-F', chain]);
    for (const r of rules) await run([bin, '-w', '-t', table, '-A', chain, ...r]);
    this.logger?.debug({ table, chain, rules: want }, 'firewall chain written');
  }

  private async chainRules(bin: string, table: string, chain: string): Promise<string[] | null> {
    const res = await run([bin, '-w', '-t', table, '-S', chain], { allowFailure: true });
    if (res.exitCode !== 0) return null;
    return res.stdout.split('\n').filter((l) => l.startsWith(`-A ${chain} `)).map((l) => l.slice(`-A ${chain} `.length));
  }

  private async ensureHook(bin: string, table: string, builtin: string, rule: string[]): Promise<void> {
    const check = await run([bin, '-w', '-t', table, '-C', builtin, ...rule], { allowFailure: true });
    if (check.exitCode === 0) return;
    await run([bin, '-w', '-t', table, '-I', builtin, '1', ...rule]);
  }

  private async removeChain(bin: string, table: string, chain: string, hooks: [string, string[]][]): Promise<void> {
    for (const [builtin, rule] of hooks) {
      for (let i = 0; i < 20; i++) {
        const res = await run([bin, '-w', '-t', table, '-D', builtin, ...rule], { allowFailure: true });
        if (res.exitCode !== 0) break;
      }
    }
    await run([bin, '-w', '-t', table, '-F', chain], { allowFailure: true });
    await run([bin, '-w', '-t', table, '-X', chain], { allowFailure: true });
  }

  // ---------------------------------------------------------------- CNI

  private bridgeConf(index: number): Record<string, unknown> {
    return {
      cniVersion: CNI_VERSION,
      name: this.networkName(index),
      type: 'bridge',
      bridge: this.bridgeName(index),
      isGateway: true,
      isDefaultGateway: true,
      ipMasq: false,
      hairpinMode: false,
      ipam: {
        type: 'host-local',
        ranges: [[{ subnet: this.subnet(index), gateway: this.gateway(index) }]],
        dataDir: this.ipamDir,
      },
    };
  }

  private loopbackConf(): Record<string, unknown> {
    return { cniVersion: CNI_VERSION, name: 'loopback', type: 'loopback' };
  }

  /** Execs a CNI plugin: the conf on stdin, the parameters in the environment. */
  private async cni(command: 'ADD' | 'DEL' | 'CHECK', conf: Record<string, unknown>, boxId: string, ifname: string) {
    const plugin = path.join(this.cniPath, String(conf.type));
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
      CNI_COMMAND: command,
      CNI_CONTAINERID: this.netnsName(boxId),
      CNI_NETNS: this.netnsPath(boxId),
      CNI_IFNAME: ifname,
      CNI_PATH: this.cniPath,
    };
    const res = await run([plugin], { input: JSON.stringify(conf), env, allowFailure: true, timeoutMs: 30_000 });
    if (res.exitCode !== 0) {
      let msg = res.stderr || res.stdout;
      try {
        const e = JSON.parse(res.stdout) as { msg?: string; details?: string };
        msg = [e.msg, e.details].filter(Boolean).join(': ');
      } catch {
        /* plain text */
      }
      throw new CommandError([`CNI_COMMAND=${command}`, plugin, ifname, boxId], res.exitCode, res.stdout, msg);
    }
    return res.stdout ? (JSON.parse(res.stdout) as Record<string, unknown>) : {};
  }

  private async netnsExists(boxId: string): Promise<boolean> {
    try {
      await fs.promises.access(this.netnsPath(boxId));
      return true;
    } catch {
      return false;
    }
  }

  /** Whether the box's netns has an eth0, and its IPv4 address when in `index`'s subnet. */
  private async eth0(boxId: string, index: number): Promise<{ present: boolean; address: string | null }> {
    const res = await run(['ip', '-n', this.netnsName(boxId), '-j', '-4', 'addr', 'show', 'dev', 'eth0'], { allowFailure: true });
    if (res.exitCode !== 0) return { present: false, address: null };
    try {
      const links = JSON.parse(res.stdout) as { addr_info?: { family: string; local: string; prefixlen: number }[] }[];
      const want = `${this.prefix16[0]}.${this.prefix16[1]}.${index}.`;
      for (const l of links) for (const a of l.addr_info ?? []) if (a.family === 'inet' && a.local.startsWith(want)) return { present: true, address: a.local };
    } catch {
      /* no JSON: no address */
    }
    return { present: true, address: null };
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

  async attach(boxId: string, net: ProjectNetwork): Promise<NetworkAttachment> {
    const index = net.index;
    const gateway = this.gateway(index);
    const netnsPath = this.netnsPath(boxId);
    if (await this.netnsExists(boxId)) {
      const eth0 = await this.eth0(boxId, index);
      if (eth0.address) {
        const lo = await run(['ip', '-n', this.netnsName(boxId), '-j', 'link', 'show', 'dev', 'lo'], { allowFailure: true });
        if (lo.stdout.includes('"UP"') || lo.stdout.includes('LOWER_UP')) return { netnsPath, address: eth0.address, gateway };
      }
      // Half made (a worker died mid-way): undo and start over. A netns that `prepare` made
      // has no eth0 yet and goes straight to ADD.
      if (eth0.present) await this.cni('DEL', this.bridgeConf(index), boxId, 'eth0').catch(() => undefined);
    } else {
      await this.prepare(boxId);
    }
    await fs.promises.mkdir(this.ipamDir, { recursive: true, mode: 0o700 });
    const t0 = Date.now();
    try {
      // lo and eth0 are independent interfaces of the netns: bring them up side by side.
      const [, result] = await Promise.all([this.cni('ADD', this.loopbackConf(), boxId, 'lo'), this.cni('ADD', this.bridgeConf(index), boxId, 'eth0')]);
      const ips = (result.ips ?? []) as { address: string; gateway?: string }[];
      const v4 = ips.find((i) => /^\d+\.\d+\.\d+\.\d+\//.test(i.address));
      if (!v4) throw new Error(`CNI bridge returned no IPv4 address for ${boxId}`);
      await writeSysctl(`/proc/sys/net/ipv6/conf/${this.bridgeName(index)}/disable_ipv6`, '1', this.logger);
      this.logger?.debug({ boxId, index, ms: Date.now() - t0 }, 'cni add');
      return { netnsPath, address: v4.address.split('/')[0], gateway };
    } catch (e) {
      await this.detach(boxId, net).catch(() => undefined);
      throw e;
    }
  }

  async detach(boxId: string, net: ProjectNetwork): Promise<void> {
    const t0 = Date.now();
    // DEL works (and frees the address) whether or not the netns is still there.
    await this.cni('DEL', this.bridgeConf(net.index), boxId, 'eth0');
    const res = await run(['ip', 'netns', 'delete', this.netnsName(boxId)], { allowFailure: true });
    if (res.exitCode !== 0 && (await this.netnsExists(boxId))) {
      throw new CommandError(['ip', 'netns', 'delete', this.netnsName(boxId)], res.exitCode, res.stdout, res.stderr);
    }
    this.logger?.debug({ boxId, ms: Date.now() - t0 }, 'cni del');
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

  /** Removes a project's bridge once no box is on it. Idempotent; answers false while in use. */
  async releaseProject(net: ProjectNetwork): Promise<boolean> {
    const name = this.bridgeName(net.index);
    const ports = await run(['ip', '-j', 'link', 'show', 'master', name], { allowFailure: true });
    if (ports.exitCode === 0 && ports.stdout.trim() && ports.stdout.trim() !== '[]') return false;
    await run(['ip', 'link', 'delete', name, 'type', 'bridge'], { allowFailure: true });
    await fs.promises.rm(path.join(this.ipamDir, this.networkName(net.index)), { recursive: true, force: true });
    return true;
  }

  /** Removes everything of this host tag: netns, bridges, firewall chains, IPAM state. */
  async destroyAll(): Promise<void> {
    for (const boxId of await this.listAttached()) {
      await run(['ip', 'netns', 'delete', this.netnsName(boxId)], { allowFailure: true });
    }
    // Bridges this data dir made (named by its IPAM state), plus any left with the full
    // tag-prefixed name pattern of this host.
    const indexes = new Set<number>();
    try {
      for (const n of await fs.promises.readdir(this.ipamDir)) {
        const m = new RegExp(`^bh${this.hostTag}p(\\d{1,3})$`).exec(n);
        if (m) indexes.add(Number(m[1]));
      }
    } catch {
      /* no state */
    }
    for (const i of indexes) {
      if (i <= 255) await run(['ip', 'link', 'delete', this.bridgeName(i), 'type', 'bridge'], { allowFailure: true });
    }
    const br = `${this.bridgePrefix}+`;
    const ipt = await this.iptables().catch(() => null);
    const ip6 = await this.ip6tables().catch(() => null);
    for (const tool of [ipt, ip6]) {
      if (!tool) continue;
      await this.removeChain(tool, 'filter', this.chainIn, [['INPUT', ['-i', br, '-j', this.chainIn]]]);
      await this.removeChain(tool, 'filter', this.chainFwd, [
        ['FORWARD', ['-i', br, '-j', this.chainFwd]],
        ['FORWARD', ['-o', br, '-j', this.chainFwd]],
      ]);
    }
    // NAT (outbound) exists for IPv4 only.
    if (ipt) await this.removeChain(ipt, 'nat', this.chainNat, [['POSTROUTING', ['-j', this.chainNat]]]);
    await fs.promises.rm(path.join(this.dataDir, 'cni'), { recursive: true, force: true });
  }
}

function checkIndex(index: number): void {
  if (!Number.isInteger(index) || index < 0 || index > 255) throw new Error(`project network index must be 0…255, not ${index}`);
}

/** iptables -S prints rules normalised; compare loosely (order and words). */
function sameRules(have: string[], want: string[][]): boolean {
  if (have.length !== want.length) return false;
  const norm = (s: string) =>
    s
      .replace(/--ctstate RELATED,ESTABLISHED/g, '--ctstate ESTABLISHED,RELATED')
      .replace(/\/32\b/g, '')
      .split(/\s+/)
      .filter(Boolean)
      .join(' ');
  return have.every((h, i) => norm(h) === norm(want[i].join(' ')));
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
