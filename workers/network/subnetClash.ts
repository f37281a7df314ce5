import fs from 'node:fs';
import { ConfigError } from '../../core/config';
import { formatIpv4, parseNet } from '../../core/netblocks';
import type { DriverLogger } from '../drivers';

/**
 * The box subnet must be this node's alone on its machine (docs/configuration.md
 * `BOXHOST_BOX_SUBNET`). podman's default network is the same 10.88.0.0/16, and a second
 * boxhost on the machine with the default would lay its bridges over this one's: two bridges
 * with one gateway address, boxes of one unreachable from the host. Read off the kernel's IPv4
 * routes (/proc/net/route, no command) at the node's start:
 * - a route inside the subnet (or equal to it) through an interface that is not one of this
 *   node's bridges → the start is refused, naming the route and the setting to change;
 * - a wider route that holds the subnet (a 10.0.0.0/8 LAN) → a warning: the bridges' narrower
 *   routes win, but the boxes cannot reach those LAN addresses.
 * Only the main routing table is read (/proc/net/route shows no other): a clash in a policy
 * routing table (a VPN's) is not seen.
 */

const RTF_UP = 0x1;
const RTF_REJECT = 0x200;

export interface Route {
  iface: string;
  base: number;
  prefix: number;
}

/** /proc/net/route's IPv4 routes (destination and mask are little-endian hex). */
export function parseRoutes(text: string): Route[] {
  const out: Route[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 8) continue;
    const dest = leHex(f[1]);
    const mask = leHex(f[7]);
    const flags = parseInt(f[3], 16);
    if (dest === null || mask === null) continue;
    // Only routes that are up and lead somewhere: an unreachable or blackhole route (REJECT)
    // puts no gateway on an address, and the bridges' narrower routes win over it.
    if (!(flags & RTF_UP) || flags & RTF_REJECT) continue;
    const prefix = mask.toString(2).replace(/0+$/, '').length;
    out.push({ iface: f[0], base: dest, prefix: mask === 0 ? 0 : prefix });
  }
  return out;
}

const leHex = (h: string): number | null => {
  if (!/^[0-9A-Fa-f]{8}$/.test(h)) return null;
  const b = h.match(/../g)!.map((x) => parseInt(x, 16));
  return ((b[3] * 256 + b[2]) * 256 + b[1]) * 256 + b[0];
};

const cidrOf = (r: { base: number; prefix: number }) => `${formatIpv4(r.base)}/${r.prefix}`;

/** The routes that clash with `subnet` (inside it or equal), and those that hold it (wider),
 *  leaving out this node's own bridges (`ownPrefix`) and default routes. */
export function clashes(routes: Route[], subnet: string, ownPrefix: string): { inside: Route[]; wider: Route[] } {
  const net = parseNet(subnet, 0, 32);
  if (typeof net === 'string') throw new Error(`subnet ${subnet} ${net}`);
  const { base, prefix } = net;
  const blockOf = (n: number, p: number) => Math.floor(n / 2 ** (32 - p));
  const inside: Route[] = [];
  const wider: Route[] = [];
  for (const r of routes) {
    if (r.prefix === 0 || r.iface.startsWith(ownPrefix)) continue;
    if (r.prefix >= prefix && blockOf(r.base, prefix) === blockOf(base, prefix)) inside.push(r);
    else if (r.prefix < prefix && blockOf(r.base, r.prefix) === blockOf(base, r.prefix)) wider.push(r);
  }
  return { inside, wider };
}

/** Refuses a subnet another interface of the machine routes (above); warns of a wider one. */
export async function assertSubnetFree(subnet: string, ownPrefix: string, logger?: DriverLogger, routesFile = '/proc/net/route'): Promise<void> {
  let text: string;
  try {
    text = await fs.promises.readFile(routesFile, 'utf8');
  } catch {
    return; // no IPv4 routing table to read: nothing to compare with
  }
  const { inside, wider } = clashes(parseRoutes(text), subnet, ownPrefix);
  if (inside.length > 0) {
    const r = inside[0];
    throw new ConfigError(
      `BOXHOST_BOX_SUBNET=${subnet} is already routed on this machine: ${cidrOf(r)} via ${r.iface}` +
        ` (another boxhost, podman's default network, or a LAN); give this node a subnet of its own, e.g. BOXHOST_BOX_SUBNET=10.89.0.0/16`,
    );
  }
  for (const r of wider) logger?.warn({ route: cidrOf(r), iface: r.iface, subnet }, 'a wider route holds the box subnet: its addresses inside the subnet are not reachable from boxes');
}
