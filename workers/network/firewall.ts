import { CommandError, run } from '../../core/command';
import { formatIpv4, LINK_LOCAL, parseIpv4 } from '../../core/netblocks';
import type { DriverLogger } from '../drivers';

/**
 * The iptables chains of one host tag (what each lets through and refuses: the comment of
 * `CniNetwork`, cni.ts): their names, the binaries that write them, and the chains and their
 * hooks written at a node's init and removed with everything of the tag. A chain is rewritten
 * only when what it holds differs from what it should hold, so an init on a live host opens no
 * window without rules. The per-bridge rules of `-SRC` are the driver's (one per live bridge).
 */
export class HostChains {
  private v4?: string;
  private v6?: string | null;

  constructor(
    readonly hostTag: string,
    private readonly logger?: DriverLogger,
  ) {}

  get chainIn(): string {
    return `BH-${this.hostTag}-IN`;
  }
  get chainFwd(): string {
    return `BH-${this.hostTag}-FWD`;
  }
  /** Per-bridge source checks (one rule per live project bridge). */
  get chainSrc(): string {
    return `BH-${this.hostTag}-SRC`;
  }
  /** Destinations refused to outbound traffic (only with `outbound`). */
  get chainOut(): string {
    return `BH-${this.hostTag}-OUT`;
  }
  get chainNat(): string {
    return `BH-${this.hostTag}-NAT`;
  }
  /** Which build boxes may reach the node's package-source proxy (sourceRules.ts). */
  get chainPkg(): string {
    return `BH-${this.hostTag}-PKG`;
  }

  async iptables(): Promise<string> {
    if (this.v4) return this.v4;
    // Debian 12 defaults to the nf_tables backend; fall back to legacy where that is broken.
    for (const bin of ['iptables', 'iptables-nft', 'iptables-legacy']) {
      const res = await run([bin, '-w', '-t', 'filter', '-L', 'INPUT', '-n'], { allowFailure: true }).catch(() => null);
      if (res && res.exitCode === 0) return (this.v4 = bin);
    }
    throw new Error('no working iptables found (tried iptables, iptables-nft, iptables-legacy)');
  }

  async ip6tables(): Promise<string | null> {
    if (this.v6 !== undefined) return this.v6;
    const v4 = await this.iptables();
    const bin = v4.replace(/^iptables/, 'ip6tables');
    const res = await run([bin, '-w', '-t', 'filter', '-L', 'INPUT', '-n'], { allowFailure: true }).catch(() => null);
    this.v6 = res && res.exitCode === 0 ? bin : null;
    return this.v6;
  }

  /**
   * Every chain and hook of the tag but `-SRC`'s rules: `refusals` (outboundRefusals; asked
   * for only when `outbound`, after `-PKG` and `-IN` are written) fill `-OUT`; without
   * `outbound` the NAT and `-OUT` chains go.
   */
  async write(o: { bridgePrefix: string; boxSubnet: string; outbound: boolean; refusals: () => Promise<string[][]> }): Promise<void> {
    const ipt = await this.iptables();
    const br = `${o.bridgePrefix}+`;
    // Emptied: a build whose node restarts is run again from a fresh box, which opens its own.
    await this.ensureChain(ipt, 'filter', this.chainPkg, []);
    await this.ensureChain(ipt, 'filter', this.chainIn, [
      ['-j', this.chainSrc],
      // A build box whose script runs reaches the package-source proxy (openSources).
      ['-j', this.chainPkg],
      ['-m', 'conntrack', '--ctstate', 'ESTABLISHED,RELATED', '-j', 'ACCEPT'],
      ['-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset'],
      ['-j', 'DROP'],
    ]);
    if (o.outbound) await this.ensureChain(ipt, 'filter', this.chainOut, await o.refusals());
    const fwd: string[][] = [
      ['-i', br, '-j', this.chainSrc],
      // Same bridge = same project: bridged, not routed.
      ['-m', 'physdev', '--physdev-is-bridged', '-j', 'ACCEPT'],
      // Routed from one project bridge to another (TCP is reset: callers fail fast).
      ['-i', br, '-o', br, '-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset'],
      ['-i', br, '-o', br, '-j', 'DROP'],
    ];
    // Before the ESTABLISHED accept: a destination protected at this start is cut at once,
    // flows already open to it included.
    if (o.outbound) fwd.push(['-i', br, '!', '-o', br, '-j', this.chainOut]);
    fwd.push(['-m', 'conntrack', '--ctstate', 'ESTABLISHED,RELATED', '-j', 'ACCEPT']);
    if (o.outbound) fwd.push(['-i', br, '!', '-o', br, '-j', 'ACCEPT']);
    fwd.push(['-i', br, '-p', 'tcp', '-j', 'REJECT', '--reject-with', 'tcp-reset']);
    fwd.push(['-j', 'DROP']);
    await this.ensureChain(ipt, 'filter', this.chainFwd, fwd);
    await this.ensureHook(ipt, 'filter', 'INPUT', ['-i', br, '-j', this.chainIn]);
    await this.ensureHook(ipt, 'filter', 'FORWARD', ['-i', br, '-j', this.chainFwd]);
    await this.ensureHook(ipt, 'filter', 'FORWARD', ['-o', br, '-j', this.chainFwd]);

    if (o.outbound) {
      await this.ensureChain(ipt, 'nat', this.chainNat, [['-s', o.boxSubnet, '!', '-d', o.boxSubnet, '-j', 'MASQUERADE']]);
      await this.ensureHook(ipt, 'nat', 'POSTROUTING', ['-j', this.chainNat]);
    } else {
      await this.removeChain(ipt, 'nat', this.chainNat, [['POSTROUTING', ['-j', this.chainNat]]]);
      // FORWARD no longer jumps to it (rewritten above).
      await this.removeChain(ipt, 'filter', this.chainOut, []);
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

  /** Every chain of the tag and the hooks that jump to them, IPv4 and IPv6. */
  async removeAll(bridgePrefix: string): Promise<void> {
    const br = `${bridgePrefix}+`;
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
    // Source checks, outbound refusals and NAT exist for IPv4 only (after IN and FWD, which
    // jump to them).
    if (ipt) {
      await this.removeChain(ipt, 'filter', this.chainSrc, []);
      await this.removeChain(ipt, 'filter', this.chainOut, []);
      await this.removeChain(ipt, 'nat', this.chainNat, [['POSTROUTING', ['-j', this.chainNat]]]);
      await this.removeChain(ipt, 'filter', this.chainPkg, []);
    }
  }

  private async ensureChain(bin: string, table: string, chain: string, rules: string[][]): Promise<void> {
    await this.makeChain(bin, table, chain);
    // Build the wanted rules, then compare with what is there: rewrite only on a difference,
    // so that an init on a live host does not open a window without rules.
    const want = rules.map((r) => r.join(' '));
    const have = await this.chainRules(bin, table, chain);
    if (have !== null && sameRules(have, rules)) return;
    await run([bin, '-w', '-t', table, '-F', chain]);
    for (const r of rules) await run([bin, '-w', '-t', table, '-A', chain, ...r]);
    this.logger?.debug({ table, chain, rules: want }, 'firewall chain written');
  }

  async makeChain(bin: string, table: string, chain: string): Promise<void> {
    const made = await run([bin, '-w', '-t', table, '-N', chain], { allowFailure: true });
    if (made.exitCode !== 0 && !/exists/i.test(made.stderr)) throw new CommandError([bin, '-t', table, '-N', chain], made.exitCode, made.stdout, made.stderr);
  }

  async chainRules(bin: string, table: string, chain: string): Promise<string[] | null> {
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
}

/**
 * What the `-OUT` chain refuses, in `iptables -S` form: link-local (cloud metadata), the box
 * subnet itself when routed away from this host (other nodes' boxes use the same subnet),
 * then the protected destinations. REJECT (admin-prohibited) so that a box fails fast.
 */
export function outboundRefusals(boxSubnet: string, protectedDestinations: string[], logger?: DriverLogger): string[][] {
  const dests = [LINK_LOCAL, boxSubnet];
  for (const d of protectedDestinations) {
    if (d.includes(':')) continue;
    const cidr = canonicalCidr(d);
    if (!cidr) throw new Error(`protected destination ${JSON.stringify(d)} is not an IPv4 address or CIDR`);
    if (!dests.includes(cidr)) dests.push(cidr);
  }
  logger?.debug({ dests }, 'outbound refused to');
  return dests.map((d) => ['-d', d, '-j', 'REJECT', '--reject-with', 'icmp-admin-prohibited']);
}

/** An IPv4 address or CIDR as `iptables -S` prints it (`a.b.c.d/n`, host bits cleared);
 *  null when it is neither. */
export function canonicalCidr(s: string): string | null {
  const [addr, bits, ...rest] = s.trim().split('/');
  const value = parseIpv4(addr);
  if (value === null || rest.length > 0) return null;
  const prefix = bits === undefined ? 32 : /^\d{1,2}$/.test(bits) ? Number(bits) : NaN;
  if (!(prefix >= 0 && prefix <= 32)) return null;
  const size = 2 ** (32 - prefix);
  return `${formatIpv4(Math.floor(value / size) * size)}/${prefix}`;
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
