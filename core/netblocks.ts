import { ID_RANGE_BASE, ID_RANGE_SIZE } from './box';

/**
 * The address layout of box networks (docs/decisions.md "Network"): BOXHOST_BOX_SUBNET is cut
 * into equal blocks of prefix BOXHOST_PROJECT_PREFIX, and project `net_index` i owns the i-th
 * block on every node. In a block the first address is the bridge's gateway and the host-local
 * range is the rest but the network and broadcast addresses. Pure arithmetic on 32-bit
 * numbers: the config validates with it, the api admits with it, the CNI driver builds with it.
 */

export const DEFAULT_BOX_SUBNET = '10.88.0.0/16';
/** /22: 1021 boxes per project, 64 projects in the default /16. */
export const DEFAULT_PROJECT_PREFIX = 22;
/** The widest and narrowest box subnet accepted. */
export const MIN_SUBNET_PREFIX = 8;
export const MAX_SUBNET_PREFIX = 24;
/** A /29 holds 5 boxes; a /30 would hold one, a /31 none. */
export const MAX_PROJECT_PREFIX = 29;
/** Network, gateway and broadcast: what a block holds besides its boxes. */
const RESERVED_PER_BLOCK = 3;
/**
 * Projects also own a range of user ids each (`projectIdMap`, core/box.ts): past this many, the
 * ranges would run beyond 32-bit ids, whatever room the subnet has.
 */
export const MAX_PROJECTS_BY_IDS = Math.floor((2 ** 32 - 1 - ID_RANGE_BASE) / ID_RANGE_SIZE);

const IPV4_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** `a.b.c.d` as a number, or null when it is not a dotted IPv4 address. */
export function parseIpv4(s: string): number | null {
  const m = IPV4_RE.exec(s.trim());
  if (!m) return null;
  const octets = m.slice(1, 5).map(Number);
  if (octets.some((o) => o > 255)) return null;
  return octets.reduce((acc, o) => acc * 256 + o, 0);
}

/** Link-local addresses (cloud metadata services among them): never reached from a box. */
export const LINK_LOCAL = '169.254.0.0/16';

/** Whether an IPv4 address lies in `cidr` (`a.b.c.d/n`, or a bare address as /32). */
export function inCidr(address: string, cidr: string): boolean {
  const [base, bits = '32'] = cidr.split('/');
  const a = parseIpv4(address);
  const b = parseIpv4(base);
  const prefix = Number(bits);
  if (a === null || b === null || !(prefix >= 0 && prefix <= 32)) return false;
  const size = 2 ** (32 - prefix);
  return Math.floor(a / size) === Math.floor(b / size);
}

export const formatIpv4 = (n: number): string => [24, 16, 8, 0].map((shift) => Math.floor(n / 2 ** shift) % 256).join('.');

/** A parsed, aligned IPv4 network. */
export interface Ipv4Net {
  /** The network address as a number. */
  base: number;
  prefix: number;
}

/**
 * `a.b.c.d/n` with `min ≤ n ≤ max` and no host bits set; else why not (a sentence fragment for
 * the config error: "must be …").
 */
export function parseNet(cidr: string, min = MIN_SUBNET_PREFIX, max = MAX_SUBNET_PREFIX): Ipv4Net | string {
  const want = `an aligned IPv4 network from /${min} to /${max}, such as ${DEFAULT_BOX_SUBNET}`;
  const [addr, bits, ...rest] = cidr.trim().split('/');
  const base = parseIpv4(addr ?? '');
  if (base === null || rest.length > 0 || bits === undefined || !/^\d{1,2}$/.test(bits)) return `must be ${want}`;
  const prefix = Number(bits);
  if (prefix < min || prefix > max) return `must be ${want}`;
  const size = 2 ** (32 - prefix);
  if (base % size !== 0) return `must be ${want} (did you mean ${formatIpv4(base - (base % size))}/${prefix}?)`;
  return { base, prefix };
}

/** One project's network on a node. */
export interface NetBlock {
  /** `a.b.c.d/p` */
  cidr: string;
  network: string;
  prefix: number;
  gateway: string;
  /** First and last address host-local hands out. */
  rangeStart: string;
  rangeEnd: string;
  broadcast: string;
}

/**
 * The layout of one installation: its box subnet, cut into project blocks. Throws on a layout
 * the config would refuse (it validates with `layoutError` first).
 */
export class NetLayout {
  readonly subnet: string;
  readonly subnetPrefix: number;
  readonly projectPrefix: number;
  /** How many projects the subnet holds (also bounded by the user-id ranges). */
  readonly maxProjects: number;
  /** How many boxes one project holds on one node. */
  readonly boxesPerProject: number;
  private readonly base: number;
  private readonly blockSize: number;

  constructor(subnet: string, projectPrefix: number) {
    const why = layoutError(subnet, projectPrefix);
    if (why) throw new Error(why);
    const net = parseNet(subnet) as Ipv4Net;
    this.base = net.base;
    this.subnetPrefix = net.prefix;
    this.subnet = `${formatIpv4(net.base)}/${net.prefix}`;
    this.projectPrefix = projectPrefix;
    this.blockSize = 2 ** (32 - projectPrefix);
    this.maxProjects = Math.min(2 ** (projectPrefix - net.prefix), MAX_PROJECTS_BY_IDS);
    this.boxesPerProject = this.blockSize - RESERVED_PER_BLOCK;
  }

  /** Whether `index` names a block of this layout. */
  has(index: number): boolean {
    return Number.isInteger(index) && index >= 0 && index < this.maxProjects;
  }

  private first(index: number): number {
    if (!this.has(index)) throw new Error(`project network index must be 0…${this.maxProjects - 1} in ${this.subnet} with /${this.projectPrefix} per project, not ${index}`);
    return this.base + index * this.blockSize;
  }

  block(index: number): NetBlock {
    const first = this.first(index);
    const last = first + this.blockSize - 1;
    return {
      cidr: `${formatIpv4(first)}/${this.projectPrefix}`,
      network: formatIpv4(first),
      prefix: this.projectPrefix,
      gateway: formatIpv4(first + 1),
      rangeStart: formatIpv4(first + 2),
      rangeEnd: formatIpv4(last - 1),
      broadcast: formatIpv4(last),
    };
  }

  /** Whether `address` is one host-local may hand out in block `index` (not its network,
   *  gateway or broadcast). */
  holds(index: number, address: string): boolean {
    const a = parseIpv4(address);
    if (a === null || !this.has(index)) return false;
    const first = this.first(index);
    return a >= first + 2 && a <= first + this.blockSize - 2;
  }

  /** The block `address` lies in (null outside the subnet). */
  indexOf(address: string): number | null {
    const a = parseIpv4(address);
    if (a === null || !this.inSubnet(address)) return null;
    const index = Math.floor((a - this.base) / this.blockSize);
    return this.has(index) ? index : null;
  }

  /** Whether `address` lies anywhere in the box subnet. */
  inSubnet(address: string): boolean {
    const a = parseIpv4(address);
    return a !== null && a >= this.base && a < this.base + 2 ** (32 - this.subnetPrefix);
  }

  /** The subnet twice as wide from the same first address (it keeps every block), or null
   *  when there is none (`a.b.c.d` not aligned to it, or already a /8). */
  widened(): string | null {
    const prefix = this.subnetPrefix - 1;
    if (prefix < MIN_SUBNET_PREFIX || this.base % 2 ** (32 - prefix) !== 0) return null;
    return `${formatIpv4(this.base)}/${prefix}`;
  }

  /** The two settings this layout comes from, as a user writes them. */
  describe(): string {
    return `BOXHOST_BOX_SUBNET=${this.subnet} BOXHOST_PROJECT_PREFIX=${this.projectPrefix}`;
  }

  /**
   * Whether boxes laid out by `was` keep their addresses under this layout: the same project
   * prefix and the same first address, this subnet as wide or wider. Widening the subnet that
   * way only adds blocks after the existing ones (more projects); anything else moves blocks.
   */
  keeps(was: NetLayout): boolean {
    return was.projectPrefix === this.projectPrefix && was.base === this.base && this.subnetPrefix <= was.subnetPrefix;
  }
}

/** Why `subnet` with `projectPrefix` is not a layout, or null when it is. */
export function layoutError(subnet: string, projectPrefix: number): string | null {
  const net = parseNet(subnet);
  if (typeof net === 'string') return `BOXHOST_BOX_SUBNET ${net}`;
  if (!Number.isInteger(projectPrefix) || projectPrefix < net.prefix || projectPrefix > MAX_PROJECT_PREFIX) {
    return `BOXHOST_PROJECT_PREFIX must be from ${net.prefix} (the prefix of BOXHOST_BOX_SUBNET) to ${MAX_PROJECT_PREFIX}, not ${projectPrefix}`;
  }
  return null;
}

/** BOXHOST_PROJECT_PREFIX when unset: /22, or the subnet itself when it is narrower (a /23 or
 *  /24 subnet holds one project). */
export function defaultProjectPrefix(subnet: string): number {
  const net = parseNet(subnet);
  return typeof net === 'string' ? DEFAULT_PROJECT_PREFIX : Math.max(DEFAULT_PROJECT_PREFIX, net.prefix);
}
