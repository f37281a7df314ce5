/**
 * How many boxes the scale run makes, in how many projects, and the host config that admits
 * them. On zfs-fuse the boxes are capped as the node's admission caps them: the daemon mounts at
 * most 1000 filesystems machine-wide (fewer if its ARC is small), the host mounts some of its own
 * and the node keeps a few spare.
 */
import fs from 'node:fs';
import os from 'node:os';
import type { Config } from '../../core/config';
import { ROOT_MOUNT_RESERVE } from '../../workers/storage/zfs';
import { ROOTS_PER_ARC_MB, ZFS_FUSE_MAX_MOUNTS, ZfsFuseDaemon } from '../../workers/storage/zfsFuse';
import { PER_PROJECT, SMALL } from './shape';

/** What a host mounts besides box roots: the pool, bases, bases/busybox, its version, boxes,
 *  data, shifted, shifted/busybox, its version (and one shifted copy per project). */
const HOST_DATASETS = 9;

/** mountinfo's filesystem types, one per mount ("… - <fstype> <source> <options>"). */
export const mountTypes = () =>
  fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' - ')[1]?.split(' ')[0] ?? '');

/** FUSE filesystems mounted on the machine: zfs-fuse's datasets (`fuse.zfs`) and its
 *  /zfs-kstat (`fuse`); another FUSE filesystem only makes the count more careful. */
const fuseMounts = () => mountTypes().filter((t) => t === 'fuse' || t.startsWith('fuse.')).length;

export interface ScaleSize {
  /** Boxes to make (≤ asked; < 1: the run is skipped). */
  N: number;
  /** Why N is less than asked, or null. */
  capped: string | null;
  projectPrefix: number;
  perProject: number;
  /** FUSE filesystems mounted before the scale host started. */
  mountedBefore: number;
}

export function sizeScale(asked: number, makeConfig: (env: Record<string, string>) => Config): ScaleSize {
  // Projects of at most 500 boxes and at most what a project's address block holds.
  const probe = makeConfig({});
  const projectPrefix = (probe as Partial<Record<'projectPrefix', number>>).projectPrefix ?? 24;
  const perProject = Math.min(PER_PROJECT, 2 ** (32 - projectPrefix) - 3);
  fs.rmSync(probe.dataDir, { recursive: true, force: true });
  // zfs-fuse mounts at most 1000 filesystems (all pools of the machine together); a box root past
  // that is made but cannot be mounted, and zfs-fuse then holds it "busy" until the daemon
  // restarts: neither it nor its pool can be destroyed (seen at box 988 of 1000). So the boxes
  // are kept to what the daemon has room for.
  const mountedBefore = fuseMounts();
  // The node's own arithmetic (ZfsStorage.rootLimit): what zfs-fuse mounts at most, or fewer
  // if its ARC holds fewer, less what else is mounted and the node's reserve.
  const held = Math.min(ZFS_FUSE_MAX_MOUNTS, Math.floor(new ZfsFuseDaemon({ info() {}, warn() {} }).runningArcMb() * ROOTS_PER_ARC_MB));
  const room = fs.existsSync('/dev/zfs') ? Infinity : held - mountedBefore - (HOST_DATASETS + Math.ceil(asked / perProject)) - ROOT_MOUNT_RESERVE;
  const N = Math.max(0, Math.min(asked, room));
  const capped =
    N < asked
      ? `zfs-fuse mounts at most ${held} filesystems here (${ZFS_FUSE_MAX_MOUNTS}, or ${ROOTS_PER_ARC_MB} per MB of its ARC); ${mountedBefore} FUSE filesystems were mounted before this host, which mounts ${HOST_DATASETS} + 1 per project of its own (and the node keeps ${ROOT_MOUNT_RESERVE} spare): ${N} boxes instead of ${asked}`
      : null;
  return { N, capped, projectPrefix, perProject, mountedBefore };
}

/** The variables added to the bench's host config for the scale host. */
export function scaleHostEnv(N: number, perProject: number): Record<string, string> {
  return {
    // Admission must take N of the smallest boxes: 1 cpu each (cpus × 1000 ≥ N on 2 cpus up to
    // 2000 boxes; past that the node claims N cpus), 64 MB each on RAM × 100, 1 GB each on the
    // 20 GB sparse pool × 1000.
    BOXHOST_CPU_OVERCOMMIT: '1000',
    ...(N > os.cpus().length * 1000 ? { BOXHOST_NODE_CPUS: String(N) } : {}),
    BOXHOST_RAM_OVERCOMMIT: '100',
    BOXHOST_POOL_SIZE_GB: '20',
    BOXHOST_STORAGE_OVERCOMMIT: '1000',
    BOXHOST_PROJECT_MAX_BOXES: String(perProject),
    BOXHOST_PROJECT_MAX_CPUS: String(perProject * SMALL.cpus),
    BOXHOST_PROJECT_MAX_RAM_MB: String(perProject * SMALL.ram_mb),
    BOXHOST_PROJECT_MAX_STORAGE_GB: String(perProject * SMALL.storage_gb),
    // The list repetitions page quickly: the bench measures latency, not the rate limiter.
    BOXHOST_RATE_LIMIT_RPS: '100000',
    BOXHOST_RATE_LIMIT_BURST: '1000000',
  };
}
