import fs from 'node:fs';
import type { IdMap } from '../../core/box';
import { applyResourceParts, resourceParts } from './limits';
import { defaultSeccompProfile, SeccompProfile } from './seccomp';

/** Where the host's boxd and busybox appear inside every box (read-only bind mounts). */
export const BOX_BOXD = '/.boxhost/boxd';
/** Where tini appeared in boxes started before boxd (`init: 'tini'`). */
export const BOX_TINI = '/.boxhost/tini';
export const BOX_BUSYBOX = '/.boxhost/busybox';

export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * Docker's default capability set without CAP_NET_RAW (raw and packet sockets: ARP and IP
 * spoofing on the project bridge; iputils' `ping` uses an ICMP datagram socket instead, which
 * the `ping_group_range` sysctl below allows), CAP_MKNOD (device nodes; the box's /dev is made
 * by runc) and CAP_AUDIT_WRITE (the host's audit log).
 */
export const DEFAULT_CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
];

/** Every box process (PID 1 and each exec, which runc gives the container's value) is a
 *  likelier OOM victim than the platform's own processes (zfs-fuse, redis, the node: ≤ 0). */
export const BOX_OOM_SCORE_ADJ = 800;
/** What boxd gives every process it starts (boxd/reaper.go): a box short of memory loses one
 *  of its processes before its PID 1. */
export const BOX_CHILD_OOM_SCORE_ADJ = 1000;

/** Docker's masked and read-only /proc and /sys paths. */
export const MASKED_PATHS = [
  '/proc/asound',
  '/proc/acpi',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
];
export const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

/** A fork bomb stops here rather than at the host's limit. */
export const DEFAULT_PIDS_LIMIT = 4096;

export interface OciSpecInput {
  rootfs: string;
  hostname: string;
  netnsPath: string;
  /** cgroups v1 path (cgroupfs driver), e.g. `/boxhost-<tag>-<boxId>`. */
  cgroupsPath: string;
  cpus: number;
  ramMb: number;
  environment: Record<string, string>;
  mounts: { source: string; destination: string; readOnly: boolean }[];
  /** The box's PID 1 and its host binary, bind-mounted at /.boxhost/: boxd; tini only for
   *  what boxes started before boxd had (their runtime still execs into them with runc). */
  init: { kind: 'boxd' | 'tini'; path: string };
  busyboxPath: string;
  /** The host's own hard RLIMIT_NOFILE; the box gets this much (asking more fails). */
  nofileHard?: number;
  pidsLimit?: number;
  /** The box's user namespace: box ids 0…size-1 are host ids hostId…; absent: none. */
  idMap?: IdMap;
  /** A user namespace (nsfs file) with that mapping to join instead of making one: the box's
   *  netns belongs to it (see userns.ts). */
  usernsPath?: string;
  /** Whether the host accounts swap (cgroup v1 memsw); when it does, memory+swap = memory. */
  memorySwap?: boolean;
  annotations?: Record<string, string>;
  arch?: string;
}

export interface OciMount {
  destination: string;
  type: string;
  source: string;
  options: string[];
}

/** The environment as `KEY=value` strings, PATH first (the box may override it). */
export function processEnv(environment: Record<string, string>): string[] {
  validateEnvironment(environment);
  const env: Record<string, string> = { PATH: DEFAULT_PATH, ...environment };
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

export function validateEnvironment(environment: Record<string, string>): void {
  for (const [k, v] of Object.entries(environment)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new Error(`invalid environment variable name ${JSON.stringify(k)}`);
    if (typeof v !== 'string' || v.includes('\0')) throw new Error(`invalid value for environment variable ${k}`);
  }
}

/**
 * The rlimits of every box process, PID 1 and exec'd ones alike (runc gives a `--process` file
 * only what it names). No core files: a crashing process must not write its memory into the
 * box's disk quota, and the box cannot raise the hard limit. Open files: the host's own hard
 * limit, which is all a box may ask for.
 */
export function boxRlimits(nofileHard: number = hostNofileHard()): { type: string; hard: number; soft: number }[] {
  const nofile = Math.max(64, Math.min(nofileHard, 1 << 20));
  return [
    { type: 'RLIMIT_NOFILE', hard: nofile, soft: nofile },
    { type: 'RLIMIT_CORE', hard: 0, soft: 0 },
  ];
}

/** The host's hard RLIMIT_NOFILE (a box may not ask for more). */
export function hostNofileHard(): number {
  try {
    const limits = fs.readFileSync('/proc/self/limits', 'utf8');
    const m = /^Max open files\s+\S+\s+(\S+)/m.exec(limits);
    if (m && m[1] !== 'unlimited') return Number(m[1]);
  } catch {
    /* fall through */
  }
  return 1024;
}

function isCleanAbsolute(p: string): boolean {
  return p.startsWith('/') && !p.split('/').some((c) => c === '..' || c === '.') && !p.includes('\0');
}

/** Builds the OCI runtime config (config.json) of a box. Pure: no I/O. */
export function buildOciSpec(input: OciSpecInput): Record<string, unknown> {
  if (!/^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$/.test(input.hostname)) throw new Error(`invalid hostname ${JSON.stringify(input.hostname)}`);
  const limits = resourceParts({ cpus: input.cpus, ramMb: input.ramMb }, input.memorySwap !== false);

  const idMap = input.idMap;
  if (idMap && !(Number.isInteger(idMap.hostId) && idMap.hostId > 0 && Number.isInteger(idMap.size) && idMap.size > 0)) {
    throw new Error(`invalid id map ${JSON.stringify(idMap)}`);
  }
  const mounts: OciMount[] = [
    { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
    {
      destination: '/dev/pts',
      type: 'devpts',
      source: 'devpts',
      options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'],
    },
    { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
    { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
    { destination: '/sys/fs/cgroup', type: 'cgroup', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', 'ro'] },
    { destination: input.init.kind === 'boxd' ? BOX_BOXD : BOX_TINI, type: 'bind', source: input.init.path, options: ['bind', 'ro', 'nosuid', 'nodev'] },
    { destination: BOX_BUSYBOX, type: 'bind', source: input.busyboxPath, options: ['bind', 'ro', 'nosuid', 'nodev'] },
  ];
  // Data volumes go first: a destination that a symlink in the box leads to /proc, /dev or the
  // agent's /.boxhost is then covered again by the system's own mounts, made after them.
  const volumes: OciMount[] = [];
  for (const m of input.mounts) {
    if (!isCleanAbsolute(m.destination) || m.destination === '/') throw new Error(`invalid mount destination ${JSON.stringify(m.destination)}`);
    if (!m.source.startsWith('/')) throw new Error(`mount source must be absolute: ${JSON.stringify(m.source)}`);
    volumes.push({
      destination: m.destination,
      type: 'bind',
      source: m.source,
      options: ['rbind', 'rprivate', 'nosuid', 'nodev', m.readOnly ? 'ro' : 'rw'],
    });
  }
  mounts.unshift(...volumes);

  const resources: Record<string, unknown> = {
    devices: [{ allow: false, access: 'rwm' }],
    pids: { limit: input.pidsLimit ?? DEFAULT_PIDS_LIMIT },
  };
  applyResourceParts(resources, limits);

  const seccomp: SeccompProfile = defaultSeccompProfile(input.arch);

  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      // boxd (docs/boxd.md): reaps zombies, keeps the box up, serves its node on fd 3 (the
      // listening socket the node made on the host side; runc passes it with --preserve-fds).
      // (tini: reaps zombies and forwards SIGTERM to the sleep, which dies of it.)
      args: input.init.kind === 'boxd' ? [BOX_BOXD] : [BOX_TINI, '-g', '--', BOX_BUSYBOX, 'sleep', '2147483647'],
      env: processEnv(input.environment),
      cwd: '/',
      capabilities: {
        bounding: DEFAULT_CAPABILITIES,
        effective: DEFAULT_CAPABILITIES,
        permitted: DEFAULT_CAPABILITIES,
      },
      rlimits: boxRlimits(input.nofileHard),
      noNewPrivileges: true,
      oomScoreAdj: BOX_OOM_SCORE_ADJ,
    },
    root: { path: input.rootfs, readonly: false },
    hostname: input.hostname,
    mounts,
    annotations: input.annotations ?? {},
    linux: {
      namespaces: [
        // runc wants the user namespace first: the others are made (or joined) inside it.
        ...(idMap ? [input.usernsPath ? { type: 'user', path: input.usernsPath } : { type: 'user' }] : []),
        { type: 'pid' },
        { type: 'network', path: input.netnsPath },
        { type: 'ipc' },
        { type: 'uts' },
        { type: 'mount' },
        { type: 'cgroup' },
      ],
      ...(idMap ? { uidMappings: [idMapping(idMap)], gidMappings: [idMapping(idMap)] } : {}),
      // ICMP datagram sockets for every group of the box, so `ping` works without CAP_NET_RAW.
      // In a user namespace the range must be ids the namespace maps (the kernel says EINVAL
      // to 2147483647 there).
      sysctl: { 'net.ipv4.ping_group_range': `0 ${idMap ? idMap.size - 1 : 2147483647}` },
      cgroupsPath: input.cgroupsPath,
      resources,
      seccomp,
      maskedPaths: MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
    },
  };
}

function idMapping(m: IdMap) {
  return { containerID: 0, hostID: m.hostId, size: m.size };
}
