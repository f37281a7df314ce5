import path from 'node:path';
import { CommandError, run } from '../../core/command';
import type { NetLayout } from '../../core/netblocks';
import { boxNet, type BoxNetRequest } from '../../core/spawner';
import type { BoxPort } from './portGuard';

export const CNI_PLUGIN_DIR = '/usr/lib/cni';
export const CNI_VERSION = '1.0.0';

/** The names the links are made under: the network driver's (cni.ts). */
export interface LinkNames {
  bridgeName(index: number): string;
  networkName(index: number): string;
  netnsName(boxId: string): string;
  netnsPath(boxId: string): string;
}

/**
 * A box's links in its netns: eth0 on its project's bridge with a lease of the project's block,
 * wired by the node's host helper over netlink or else by the CNI `bridge` + `host-local`
 * plugins (called directly, the conf on stdin), and loopback (the `loopback` plugin). Leases are
 * host-local's files in `ipamDir` whichever wires them, so either can free the other's.
 */
export class BoxLinks {
  constructor(private readonly o: { layout: NetLayout; ipamDir: string; cniPath: string; names: LinkNames }) {}

  /** The box's loopback up (the CNI `loopback` plugin). */
  async loopbackUp(boxId: string): Promise<void> {
    await this.cni('ADD', { cniVersion: CNI_VERSION, name: 'loopback', type: 'loopback' }, boxId, 'lo');
  }

  private bridgeConf(index: number): Record<string, unknown> {
    const b = this.o.layout.block(index);
    return {
      cniVersion: CNI_VERSION,
      name: this.o.names.networkName(index),
      type: 'bridge',
      bridge: this.o.names.bridgeName(index),
      isGateway: true,
      isDefaultGateway: true,
      ipMasq: false,
      hairpinMode: false,
      // Frames from the veth must carry the container's MAC (nftables `bridge nat`, via nft).
      ipam: {
        type: 'host-local',
        // The block but its network, gateway and broadcast addresses.
        ranges: [[{ subnet: b.cidr, gateway: b.gateway, rangeStart: b.rangeStart, rangeEnd: b.rangeEnd }]],
        dataDir: this.o.ipamDir,
      },
    };
  }

  /** What the node's helper needs to wire (or unwire) the box's eth0 as the plugins would. */
  private boxNetRequest(boxId: string, index: number): BoxNetRequest {
    const b = this.o.layout.block(index);
    return {
      netns: this.o.names.netnsPath(boxId),
      containerId: this.o.names.netnsName(boxId),
      ifname: 'eth0',
      bridge: this.o.names.bridgeName(index),
      leaseDir: path.join(this.o.ipamDir, this.o.names.networkName(index)),
      subnet: b.cidr,
      gateway: b.gateway,
      rangeStart: b.rangeStart,
      rangeEnd: b.rangeEnd,
    };
  }

  /**
   * The box's eth0 on the project bridge with an address of its block: through the node's
   * helper over netlink (boxd/boxnet.go: the plugins' work without their two programs, ≈60 ms of
   * CPU a create here), else the CNI bridge plugin. Answers its port (host-side veth, MAC and
   * address).
   */
  async addEth0(boxId: string, index: number): Promise<BoxPort> {
    const native = await boxNet(this.boxNetRequest(boxId, index));
    if (native) {
      if (!native.hostVeth || !native.mac || !/^\d+\.\d+\.\d+\.\d+\//.test(native.address)) throw new Error(`the helper did not name the veth, MAC and address of ${boxId}`);
      return { veth: native.hostVeth, mac: native.mac, address: native.address.split('/')[0] };
    }
    const result = await this.cni('ADD', this.bridgeConf(index), boxId, 'eth0');
    const ips = (result.ips ?? []) as { address: string; gateway?: string }[];
    const v4 = ips.find((i) => /^\d+\.\d+\.\d+\.\d+\//.test(i.address));
    if (!v4) throw new Error(`CNI bridge returned no IPv4 address for ${boxId}`);
    const ifaces = (result.interfaces ?? []) as { name: string; mac?: string; sandbox?: string }[];
    const veth = ifaces.find((i) => !i.sandbox && i.name !== this.o.names.bridgeName(index))?.name;
    const mac = ifaces.find((i) => i.sandbox && i.name === 'eth0')?.mac;
    if (!veth || !mac) throw new Error(`CNI bridge did not name the veth and MAC of ${boxId}`);
    return { veth, mac, address: v4.address.split('/')[0] };
  }

  /** Removes the box's eth0 (when its netns is there) and frees its lease: the helper, else the
   *  CNI plugin's DEL. Idempotent. */
  async delEth0(boxId: string, index: number): Promise<void> {
    if (await boxNet({ ...this.boxNetRequest(boxId, index), delete: true })) return;
    await this.cni('DEL', this.bridgeConf(index), boxId, 'eth0');
  }

  /** Execs a CNI plugin: the conf on stdin, the parameters in the environment. */
  private async cni(command: 'ADD' | 'DEL' | 'CHECK', conf: Record<string, unknown>, boxId: string, ifname: string) {
    const plugin = path.join(this.o.cniPath, String(conf.type));
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
      CNI_COMMAND: command,
      CNI_CONTAINERID: this.o.names.netnsName(boxId),
      CNI_NETNS: this.o.names.netnsPath(boxId),
      CNI_IFNAME: ifname,
      CNI_PATH: this.o.cniPath,
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
}
