import net from 'node:net';

/**
 * Where the service itself may connect on a user's behalf (webhook deliveries): never to the
 * host's own loopback, private, link-local (cloud metadata), carrier-grade NAT, multicast or
 * reserved addresses, nor to the boxes' subnet, unless a configured network allows it
 * (`BOXHOST_WEBHOOK_ALLOW_NETS`). Checked on the addresses a name resolves to, and the
 * connection goes to the address checked (no second lookup to rebind).
 */
const DENIED_V4 = ['0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12', '192.0.0.0/24', '192.0.2.0/24', '192.168.0.0/16', '198.18.0.0/15', '198.51.100.0/24', '203.0.113.0/24', '224.0.0.0/4', '240.0.0.0/4'];
// IPv4-compatible, NAT64, 6to4 and Teredo forms carry an IPv4 address a gateway may reach.
const DENIED_V6 = ['::/96', '::1/128', '64:ff9b::/96', '64:ff9b:1::/48', '100::/64', '2001::/32', '2001:db8::/32', '2002::/16', 'fc00::/7', 'fe80::/10', 'fec0::/10', 'ff00::/8'];

function addCidr(list: net.BlockList, cidr: string): void {
  const [address, bits] = cidr.split('/');
  const type = net.isIPv6(address) ? 'ipv6' : 'ipv4';
  if (bits === undefined) list.addAddress(address, type);
  else list.addSubnet(address, Number(bits), type);
}

/** A CIDR or address the policy can take, or why not. */
export function cidrError(cidr: string): string | null {
  const [address, bits, more] = cidr.split('/');
  if (more !== undefined || !net.isIP(address)) return `${cidr} is not an address or CIDR`;
  if (bits === undefined) return null;
  const max = net.isIPv6(address) ? 128 : 32;
  return /^\d+$/.test(bits) && Number(bits) <= max ? null : `${cidr} has a bad prefix length`;
}

export class AddressPolicy {
  private readonly always = new net.BlockList();
  private readonly denied = new net.BlockList();
  private readonly allowed = new net.BlockList();

  /** `platform`: refused whatever `allow` says (the boxes' subnet, the platform's own hosts);
   *  `allow`: allowed although in the default list (an internal receiver). */
  constructor(opts: { platform?: string[]; allow?: string[] } = {}) {
    for (const c of opts.platform ?? []) addCidr(this.always, c);
    for (const c of [...DENIED_V4, ...DENIED_V6]) addCidr(this.denied, c);
    for (const c of opts.allow ?? []) addCidr(this.allowed, c);
  }

  /** Why the service may not connect to `address` (an IP), or null when it may. */
  refusal(address: string): string | null {
    // An IPv4 address written as IPv6 (::ffff:127.0.0.1) is judged as the IPv4 one.
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
    const ip = mapped ?? address;
    const type = net.isIPv6(ip) ? 'ipv6' : net.isIPv4(ip) ? 'ipv4' : null;
    if (!type) return `${address} is not an IP address`;
    if (this.always.check(ip, type)) return `${address} is an address of the platform or its boxes`;
    if (this.allowed.check(ip, type)) return null;
    return this.denied.check(ip, type) ? `${address} is a loopback, private, link-local or reserved address` : null;
  }
}

/** The host part of a service URL ('' for `unix:`, `sqlite:`, `file:`), without IPv6 brackets. */
export function urlHost(url: string): string {
  try {
    return new URL(url).hostname.replace(/^\[(.*)\]$/, '$1');
  } catch {
    return '';
  }
}
