import { run } from '../../core/command';
import { parseIpv4 } from '../../core/netblocks';

/**
 * The package-source proxy's door (docs/bases.md "Builds reach the package sources"): while a
 * base build's script runs, its temporary box may open TCP connections to the node's proxy port
 * on its bridge's gateway address, even though boxes can otherwise open nothing on their host.
 * One rule per box in the filter chain `BH-<tag>-PKG`, which `-IN` jumps to right after its
 * source check:
 *
 *   `-s <box>/32 -d <gateway>/32 -p tcp -m tcp --dport <port> -m comment --comment bhbox-<id> -j ACCEPT`
 *
 * The comment names the box: closing deletes exactly its rules, so two builds never touch each
 * other's. The proxy itself answers only the boxes it was told of, for the sources' names.
 */
export class SourceRules {
  constructor(
    private readonly ipt: () => Promise<string>,
    readonly chain: string,
  ) {}

  static comment = (boxId: string) => `bhbox-${boxId}`;

  /** The rule (without chain and target) for one box, as `iptables -S` prints it. */
  static match(address: string, gateway: string, port: number, boxId: string): string[] {
    return ['-s', `${address}/32`, '-d', `${gateway}/32`, '-p', 'tcp', '-m', 'tcp', '--dport', String(port), '-m', 'comment', '--comment', SourceRules.comment(boxId)];
  }

  /** Replaces the box's rule with one for `port` on `gateway`. */
  async open(boxId: string, address: string, gateway: string, port: number): Promise<void> {
    if (parseIpv4(address) === null) throw new Error(`invalid box address ${JSON.stringify(address)}`);
    if (parseIpv4(gateway) === null) throw new Error(`invalid gateway ${JSON.stringify(gateway)}`);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`invalid proxy port ${port}`);
    await this.close(boxId);
    await run([await this.ipt(), '-w', '-t', 'filter', '-A', this.chain, ...SourceRules.match(address, gateway, port, boxId), '-j', 'ACCEPT']);
  }

  /** Deletes every rule of the box. */
  async close(boxId: string): Promise<void> {
    const ipt = await this.ipt();
    for (const rule of await this.rulesOf(ipt, boxId)) await run([ipt, '-w', '-t', 'filter', '-D', this.chain, ...rule], { allowFailure: true });
  }

  /** The chain's rules (`-S` form without `-A <chain>`); none when the chain is missing. */
  private async list(ipt: string): Promise<string[]> {
    const res = await run([ipt, '-w', '-t', 'filter', '-S', this.chain], { allowFailure: true });
    if (res.exitCode !== 0) return [];
    return res.stdout
      .split('\n')
      .filter((l) => l.startsWith(`-A ${this.chain} `))
      .map((l) => l.slice(`-A ${this.chain} `.length));
  }

  /** The box's rules, split into arguments. */
  private async rulesOf(ipt: string, boxId: string): Promise<string[][]> {
    const tag = `--comment ${SourceRules.comment(boxId)} `;
    return (await this.list(ipt)).filter((l) => `${l} `.includes(tag)).map((l) => l.split(' '));
  }

  /** Every box with a rule (for tests). */
  async boxes(): Promise<string[]> {
    const rules = await this.list(await this.ipt());
    return [...new Set(rules.flatMap((l) => [...l.matchAll(/--comment bhbox-([a-z0-9]+)/g)].map((m) => m[1])))].sort();
  }
}
