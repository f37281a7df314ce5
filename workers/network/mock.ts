import { formatIpv4, NetLayout, parseIpv4 } from '../../core/netblocks';
import type { NetworkAttachment, NetworkDriver, ProjectNetwork } from '../drivers';
import { WithFaults } from '../mockFaults';

type Method = keyof NetworkDriver;

/**
 * NetworkDriver in memory, for tests that need no root and no CNI. Models what the CNI driver
 * keeps apart: the set of netns (what `listAttached` reports) and each project network's
 * address leases (host-local IPAM). `detach` frees the lease on the network it is given and
 * deletes the netns whatever that network, as a CNI DEL plus `ip netns delete` do.
 */
export class MockNetwork extends WithFaults<Method> implements NetworkDriver {
  private readonly netns = new Set<string>();
  /** Project index → box id → address. */
  private readonly leases = new Map<number, Map<string, string>>();

  /** The blocks it hands addresses from, as the CNI driver's (default: a /24 per project of
   *  10.250.0.0/16, so project i's first box is 10.250.i.2). */
  constructor(readonly layout = new NetLayout('10.250.0.0/16', 24)) {
    super();
  }


  /** The addresses leased on one project network, by box id (for assertions). */
  leasesOf(index: number): ReadonlyMap<string, string> {
    return this.leases.get(index) ?? new Map();
  }

  async init(): Promise<void> {
    this.fault('init');
  }

  async prepare(boxId: string): Promise<string> {
    this.fault('prepare');
    this.netns.add(boxId);
    return netnsPath(boxId);
  }

  async attach(boxId: string, net: ProjectNetwork): Promise<NetworkAttachment> {
    this.fault('attach');
    this.netns.add(boxId);
    const leases = this.leases.get(net.index) ?? new Map<string, string>();
    this.leases.set(net.index, leases);
    const block = this.layout.block(net.index);
    let address = leases.get(boxId);
    if (address === undefined) {
      const taken = new Set(leases.values());
      for (let a = parseIpv4(block.rangeStart)!; a <= parseIpv4(block.rangeEnd)! && address === undefined; a++) {
        if (!taken.has(formatIpv4(a))) address = formatIpv4(a);
      }
      // host-local's own words, as the CNI driver's failure carries them.
      if (address === undefined) throw new Error(`failed to allocate for range 0: no IP addresses available in range set: ${block.rangeStart}-${block.rangeEnd}`);
      leases.set(boxId, address);
    }
    return { netnsPath: netnsPath(boxId), address, gateway: block.gateway };
  }

  async detach(boxId: string, net: ProjectNetwork): Promise<void> {
    this.fault('detach');
    this.leases.get(net.index)?.delete(boxId);
    this.netns.delete(boxId);
    this.sources.delete(boxId);
  }

  /** What `openSources` opened, by box id (for assertions). */
  readonly sources = new Map<string, { address: string; port: number }>();

  async openSources(boxId: string, address: string, port: number): Promise<string> {
    this.fault('openSources');
    this.sources.set(boxId, { address, port });
    const index = this.layout.indexOf(address);
    if (index === null) throw new Error(`box address ${address} is in no project block`);
    return this.layout.block(index).gateway;
  }

  async closeSources(boxId: string): Promise<void> {
    this.fault('closeSources');
    this.sources.delete(boxId);
  }

  netnsPath(boxId: string): string {
    return `/mock/netns/${boxId}`;
  }

  async releaseProject(net: ProjectNetwork): Promise<boolean> {
    this.fault('releaseProject');
    if ((this.leases.get(net.index)?.size ?? 0) > 0) return false;
    this.leases.delete(net.index);
    return true;
  }

  async listAttached(): Promise<string[]> {
    this.fault('listAttached');
    return [...this.netns].sort();
  }
}

const netnsPath = (boxId: string) => `/run/netns/mock-${boxId}`;
