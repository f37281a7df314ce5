import type { NetworkAttachment, NetworkDriver, ProjectNetwork } from '../drivers';
import { WithFaults } from '../mockFaults';

type Method = keyof NetworkDriver;

/** Host numbers a project's /24 hands out: .1 is the gateway, .255 broadcast. */
const FIRST_HOST = 2;
const LAST_HOST = 254;

const prefix = (index: number) => `10.250.${index}`;

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
    let address = leases.get(boxId);
    if (address === undefined) {
      const taken = new Set(leases.values());
      for (let host = FIRST_HOST; host <= LAST_HOST && address === undefined; host++) {
        if (!taken.has(`${prefix(net.index)}.${host}`)) address = `${prefix(net.index)}.${host}`;
      }
      if (address === undefined) throw new Error(`project network ${net.index} has no free address`);
      leases.set(boxId, address);
    }
    return { netnsPath: netnsPath(boxId), address, gateway: `${prefix(net.index)}.1` };
  }

  async detach(boxId: string, net: ProjectNetwork): Promise<void> {
    this.fault('detach');
    this.leases.get(net.index)?.delete(boxId);
    this.netns.delete(boxId);
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
