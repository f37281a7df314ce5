/**
 * Host memory per idle box: used memory without the page cache and reclaimable slab
 * (MemTotal − MemFree − Buffers − Cached − SReclaimable; caches are never dropped) before the
 * first create and after all N run, each the median of 10 snapshots a second apart while the host
 * idles, the difference divided by N; the zfs-fuse daemon's RSS before and after; each box's
 * cgroup `memory.usage_in_bytes` (p50). The figure is machine-wide: whatever else runs on the
 * machine meanwhile moves it (by ±0.2 MiB per box for ±200 MiB). Before each, 5 s of the idle
 * host's CPU (the machine's, the zfs-fuse daemon's, the bench's process's: api + node): what idle
 * boxes cost while nothing is asked of them.
 */
import fs from 'node:fs';
import path from 'node:path';
import { statFields } from '../../core/procStamp';
import type { RuncRuntime } from '../../workers/runtime/runc';
import type { Api } from '../api';
import { summaryJson } from '../report';
import { nowMs, round1, summarize } from '../stats';
import { mountTypes } from './capacity';
import { sleep } from './common';
import type { Created } from './create';
import { countRunning, walkList } from './list';
import { IDLE_SETTLE_MS } from './shape';

function meminfoKb(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of fs.readFileSync('/proc/meminfo', 'utf8').split('\n')) {
    const m = /^(\w+(?:\(\w+\))?):\s+(\d+)/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

function statusKb(pid: string, field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

export interface MemSnapshot {
  /** MemTotal − MemFree − Buffers − Cached − SReclaimable. */
  used_no_cache_kb: number;
  /** MemTotal − MemAvailable, for comparison. */
  used_minus_available_kb: number;
  meminfo_kb: Record<string, number>;
  zfs_fuse_pids: number[];
  zfs_fuse_rss_kb: number;
  /** This process: the api and the node run in it. */
  bench_process_rss_kb: number;
  processes: number;
  /** zfs-fuse datasets mounted, machine-wide (the daemon holds at most 1000: MAX_FILESYSTEMS). */
  zfs_fuse_mounts: number;
}

/** The machine's CPU over the idle window, in CPUs busy (2.0: both cores of a 2-core host), and
 *  the part of it the zfs-fuse daemon and this process (api + node) took. */
export interface IdleCpu {
  busy_cpus: number;
  zfs_fuse_cpus: number;
  bench_process_cpus: number;
}

export type SettledMemory = MemSnapshot & { used_no_cache_samples_kb: number[]; idle_cpu: IdleCpu };

/** How long the idle CPU is measured, before the memory's snapshots. */
const CPU_WINDOW_MS = 5000;

/** Jiffies: the machine's busy and total (from /proc/stat's cpu line), and one process's. */
function machineTicks(): { busy: number; total: number } {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal guest guest_nice: busy is user, nice,
  // system, irq and softirq (guest time is inside user already; steal is not this machine's).
  return { busy: f[0] + f[1] + f[2] + f[5] + f[6], total: f.slice(0, 8).reduce((a, b) => a + b, 0) };
}

function processTicks(pid: number | 'self'): number {
  // utime and stime: fields 14 and 15.
  const f = statFields(pid);
  return f ? Number(f[11]) + Number(f[12]) : 0;
}

function memSnapshot(): MemSnapshot {
  const mi = meminfoKb();
  const pick = ['MemTotal', 'MemFree', 'MemAvailable', 'Buffers', 'Cached', 'SReclaimable', 'SUnreclaim', 'Shmem', 'AnonPages', 'KernelStack', 'PageTables', 'Slab'];
  const zfsPids: number[] = [];
  let zfsRss = 0;
  let processes = 0;
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    processes++;
    let comm = '';
    try {
      comm = fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    } catch {
      continue;
    }
    if (comm === 'zfs-fuse') {
      zfsPids.push(Number(pid));
      zfsRss += statusKb(pid, 'VmRSS');
    }
  }
  return {
    zfs_fuse_mounts: mountTypes().filter((t) => t === 'fuse.zfs').length,
    used_no_cache_kb: mi.MemTotal - mi.MemFree - mi.Buffers - mi.Cached - mi.SReclaimable,
    used_minus_available_kb: mi.MemTotal - mi.MemAvailable,
    meminfo_kb: Object.fromEntries(pick.filter((k) => k in mi).map((k) => [k, mi[k]])),
    zfs_fuse_pids: zfsPids,
    zfs_fuse_rss_kb: zfsRss,
    bench_process_rss_kb: Math.round(process.memoryUsage().rss / 1024),
    processes,
  };
}

/** A box's cgroup (v1, memory controller): usage and the rss/cache split of memory.stat. */
function boxCgroupMemory(runtime: RuncRuntime, boxId: string): { usage: number; rss: number; cache: number } | null {
  const dir = path.join('/sys/fs/cgroup/memory', runtime.cgroupsPath(boxId));
  try {
    const usage = Number(fs.readFileSync(path.join(dir, 'memory.usage_in_bytes'), 'utf8').trim());
    const stat = Object.fromEntries(
      fs
        .readFileSync(path.join(dir, 'memory.stat'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => l.split(' '))
        .map(([k, v]) => [k, Number(v)]),
    );
    return { usage, rss: stat.total_rss ?? stat.rss ?? 0, cache: stat.total_cache ?? stat.cache ?? 0 };
  } catch {
    return null;
  }
}

/**
 * Memory after the host has idled IDLE_SETTLE_MS: one snapshot a second through it, and the one
 * with the median used memory (others work on this machine too: a compile elsewhere passing
 * through one snapshot does not decide the figure).
 */
export async function settledMemory(): Promise<SettledMemory> {
  // The CPU first, through a window of its own: the snapshots below read every process's comm
  // and the mount table, work that grows with the boxes and is not theirs.
  const zfsPids = memSnapshot().zfs_fuse_pids;
  const m0 = machineTicks();
  const z0 = zfsPids.reduce((a, p) => a + processTicks(p), 0);
  const b0 = processTicks('self');
  const t0 = nowMs();
  await sleep(CPU_WINDOW_MS);
  // Jiffies are 1/100 s (USER_HZ); CPUs busy = busy jiffies / 100 / seconds.
  const secs = (nowMs() - t0) / 1000;
  const m1 = machineTicks();
  const cpus = (ticks: number) => Math.max(0, Math.round((ticks / 100 / secs) * 1000) / 1000);
  const idle_cpu: IdleCpu = {
    busy_cpus: cpus(m1.busy - m0.busy),
    // (A daemon restarted meanwhile would count from 0: never below 0.)
    zfs_fuse_cpus: cpus(zfsPids.reduce((a, p) => a + processTicks(p), 0) - z0),
    bench_process_cpus: cpus(processTicks('self') - b0),
  };
  const snaps: MemSnapshot[] = [];
  for (let k = 0; k < IDLE_SETTLE_MS / 1000; k++) {
    await sleep(1000);
    snaps.push(memSnapshot());
  }
  const sorted = [...snaps].sort((a, b) => a.used_no_cache_kb - b.used_no_cache_kb);
  return { ...sorted[Math.floor((sorted.length - 1) / 2)], used_no_cache_samples_kb: snaps.map((x) => x.used_no_cache_kb), idle_cpu };
}

/**
 * Waits until the node is calm after the creates; returns how long that took (ms). A node that
 * does not settle within 10 minutes is a problem, and the memory is measured anyway.
 */
export async function waitUntilSettled(api: Api, created: Created[], problems: string[]): Promise<number> {
  // After a storage restart the node starts its boxes again, 4 at a time: memory is measured
  // once it is done (the node's storage check "ok" and every box made running).
  const calm0 = nowMs();
  for (;;) {
    const node = await api.call('GET', '/v1/nodes/local');
    const listed = await walkList(api, '-').catch(() => null);
    const notRunning = listed ? listed.boxes.length - (await countRunning(api)) : -1;
    // Creates that failed keep their row (status failed); one refused up front made none.
    if (node.body?.storage === 'ok' && notRunning === created.filter((c) => c.error && c.opId !== null).length) break;
    if (nowMs() - calm0 > 600_000) {
      problems.push(`the node did not settle within 10 min (storage ${node.body?.storage}, ${notRunning} boxes not running)`);
      break;
    }
    await sleep(2000);
  }
  return nowMs() - calm0;
}

/** The per-box memory figures (results.json `memory`): the idle host's memory after less before,
 *  over the boxes running, and each box's cgroup. */
export function memoryPerBox(memBefore: SettledMemory, memAfter: SettledMemory, ok: Created[], runtime: RuncRuntime) {
  const cg = ok.map((c) => (c.boxId ? boxCgroupMemory(runtime, c.boxId) : null)).filter((x): x is NonNullable<typeof x> => x !== null);
  const n = ok.length || 1;
  return {
    used_no_cache_per_box_kb: round1((memAfter.used_no_cache_kb - memBefore.used_no_cache_kb) / n),
    used_minus_available_per_box_kb: round1((memAfter.used_minus_available_kb - memBefore.used_minus_available_kb) / n),
    zfs_fuse_rss_before_kb: memBefore.zfs_fuse_rss_kb,
    zfs_fuse_rss_after_kb: memAfter.zfs_fuse_rss_kb,
    zfs_fuse_rss_per_box_kb: round1((memAfter.zfs_fuse_rss_kb - memBefore.zfs_fuse_rss_kb) / n),
    // The daemon's ARC grows and shrinks with what was read before (a bench or soak just
    // before this one leaves it full): the machine-wide figure moves with it. Without it:
    used_no_cache_without_zfs_fuse_per_box_kb: round1((memAfter.used_no_cache_kb - memBefore.used_no_cache_kb - (memAfter.zfs_fuse_rss_kb - memBefore.zfs_fuse_rss_kb)) / n),
    bench_process_rss_per_box_kb: round1((memAfter.bench_process_rss_kb - memBefore.bench_process_rss_kb) / n),
    processes_per_box: round1((memAfter.processes - memBefore.processes) / n),
    kernel_per_box_kb: Object.fromEntries(
      ['SUnreclaim', 'KernelStack', 'PageTables', 'Shmem', 'AnonPages'].map((k) => [k, round1(((memAfter.meminfo_kb[k] ?? 0) - (memBefore.meminfo_kb[k] ?? 0)) / n)]),
    ),
    cgroups_read: cg.length,
    cgroup_usage_bytes: summaryJson(summarize(cg.map((x) => x.usage))),
    cgroup_rss_bytes: summaryJson(summarize(cg.map((x) => x.rss))),
    cgroup_cache_bytes: summaryJson(summarize(cg.map((x) => x.cache))),
    cgroup_usage_sum_kb: Math.round(cg.reduce((a, x) => a + x.usage, 0) / 1024),
  };
}

export type MemoryPerBox = ReturnType<typeof memoryPerBox>;
