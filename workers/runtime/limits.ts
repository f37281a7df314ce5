import fs from 'node:fs';
import type { BoxLimits } from '../../cluster/types';

/**
 * The one place a box's cpu and memory limits become numbers. The OCI spec of a new container
 * and a live `runc update` (with its bundle rewrite) both start from `resourceParts`, so a box
 * updated live has exactly the limits it would have been started with.
 */

export const CPU_PERIOD_US = 100_000;
export const MIN_RAM_MB = 4;

export type { BoxLimits };

/** The memory and cpu parts of OCI `linux.resources`; a part left out is not changed. */
export interface ResourceParts {
  /** `swap` (memory+swap) only when the host accounts swap; then it equals `limit`. */
  memory?: { limit: number; swap?: number };
  /** null: no CPU limit. */
  cpu?: { quota: number; period: number } | null;
}

/** CFS quota for a number of CPUs (null: no limit). */
export function cpuQuota(cpus: number | undefined): number | null {
  if (!cpus || cpus <= 0) return null;
  return Math.max(1000, Math.round(cpus * CPU_PERIOD_US));
}

export function memoryBytes(ramMb: number): number {
  return Math.round(ramMb * 1024 * 1024);
}

/** cgroup v1 without swap accounting has no memsw files: then no swap limit can be set. */
export function hostAccountsSwap(): boolean {
  if (!fs.existsSync('/sys/fs/cgroup/memory')) return true; // cgroup v2: runc maps it
  return fs.existsSync('/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes');
}

export function resourceParts(limits: BoxLimits, accountsSwap: boolean): ResourceParts {
  const parts: ResourceParts = {};
  if (limits.ramMb !== undefined) {
    if (!(limits.ramMb >= MIN_RAM_MB)) throw new RangeError(`ramMb must be at least ${MIN_RAM_MB}`);
    const limit = memoryBytes(limits.ramMb);
    parts.memory = accountsSwap ? { limit, swap: limit } : { limit };
  }
  if (limits.cpus !== undefined) {
    const quota = cpuQuota(limits.cpus);
    parts.cpu = quota === null ? null : { quota, period: CPU_PERIOD_US };
  }
  return parts;
}

/** Writes the parts into an OCI `linux.resources` object (a spec's or a bundle's). */
export function applyResourceParts(resources: Record<string, unknown>, parts: ResourceParts): void {
  if (parts.memory) resources.memory = { ...parts.memory };
  if (parts.cpu === null) delete resources.cpu;
  else if (parts.cpu) resources.cpu = { ...parts.cpu };
}

/** The same parts as `runc update` options (before the container id). */
export function runcUpdateArgs(parts: ResourceParts): string[] {
  const args: string[] = [];
  if (parts.memory) {
    // Both together: raising the memory limit alone fails (memsw must move first) and can
    // leave runc's state.json inconsistent.
    args.push('--memory', String(parts.memory.limit));
    if (parts.memory.swap !== undefined) args.push('--memory-swap', String(parts.memory.swap));
  }
  if (parts.cpu !== undefined) {
    // runc cannot remove a quota, only set it to -1 (unlimited).
    args.push('--cpu-period', String(parts.cpu?.period ?? CPU_PERIOD_US), '--cpu-quota', String(parts.cpu?.quota ?? -1));
  }
  return args;
}
