/**
 * The scale figures' printed report: the per-hundred create table with the last/first ratio
 * against its target, the host steps that grew most, a table of the figures at scale (lists,
 * memory per idle box, zfs-fuse's RSS, the boxes' cgroups, deletes) and the notes.
 */
import { fmtMs, summarize, table } from '../stats';
import { mib, p50p95 } from './common';
import type { Created, CreateFigures } from './create';
import type { ListFigures } from './list';
import type { SettledMemory } from './memory';
import type { ScaleHostLog } from './hostLog';
import { BATCH, CLI_REPS, CREATE_CONCURRENCY, DELETE_CONCURRENCY, LIST_REPS, SCALE_TARGET, SMALL } from './shape';

export function scaleReport(opts: {
  N: number;
  nProjects: number;
  /** The scale results so far (create, memory, list, node_storage_restarts, delete). */
  results: Record<string, any>;
  creates: CreateFigures;
  lists: ListFigures;
  memBefore: SettledMemory;
  memAfter: SettledMemory;
  /** Boxes that ended running. */
  okCount: number;
  created: Created[];
  /** Delete latencies (ms). */
  deletes: number[];
  capped: string | null;
  stoppedEarly: string | null;
  hostLog: ScaleHostLog;
}): string[] {
  const { N, nProjects, results, memBefore, memAfter, created, deletes, capped, stoppedEarly } = opts;
  const { perHundred, first, last, ratio, growth } = opts.creates;
  const { allRuns, oneRuns, cliNote, cliRuns, cliVersion } = opts.lists;
  const { warningCount, warnings } = opts.hostLog;
  const report: string[] = [];
  const m = results.memory;
  const rows = [['boxes', 'create p50 / p95 (ms)', 'vs first p50', 'request→job p50', 'job p50 / p95', 'job done→answer p50', 'boxes/s', '']];
  for (const p of perHundred) {
    rows.push([
      p.range,
      p50p95(p.create),
      `${(p.create.p50 / first.create.p50).toFixed(2)}x`,
      fmtMs(p.to_job.p50),
      p50p95(p.job),
      fmtMs(p.after_job.p50),
      p.boxes_per_s.toFixed(1),
      [p.failures ? `${p.failures} failed` : '', p.retries ? `${p.retries} job retries` : '', p.asked_again_after_503 ? `${p.asked_again_after_503} asked again after 503` : '', p.storage_restarts ? `zfs-fuse restarted by the watchdog ×${p.storage_restarts}` : ''].filter(Boolean).join(', '),
    ]);
  }
  report.push(`scale: ${N} boxes (${SMALL.cpus} cpu, ${SMALL.ram_mb} MB, ${SMALL.storage_gb} GB) on one node in ${nProjects} project${nProjects === 1 ? '' : 's'}, created ${BATCH} per batch, ${CREATE_CONCURRENCY} at a time through the API (?wait), in ${results.create.wall_s} s`);
  report.push(table(rows));
  report.push(`create p50, last hundred / first hundred: ${fmtMs(last.create.p50)} / ${fmtMs(first.create.p50)} ms = ${ratio.toFixed(2)}x (target <= ${SCALE_TARGET}x): ${ratio <= SCALE_TARGET ? 'PASS' : 'MISS'}`);
  const grow = [['host step (per create)', `${first.range} ms/op`, `${last.range} ms/op`, 'growth', `p50 per call ${first.range} → ${last.range}`]];
  for (const g of growth.slice(0, 8)) grow.push([g.label, fmtMs(g.first_ms_per_op), fmtMs(g.last_ms_per_op), `${(g.last_ms_per_op - g.first_ms_per_op).toFixed(1)}`, `${fmtMs(g.first_p50)} → ${fmtMs(g.last_p50)}`]);
  report.push(`where the create time grew (the steps with the most added ms per create; methods include their commands):\n${table(grow)}`);
  const L = results.list;
  const other = [['at scale', 'p50 / p95', 'detail']];
  other.push([`list every project (${L.all_projects.pages} pages)`, p50p95(summarize(allRuns.map((r) => r.ms))) + ' ms', `${L.all_projects.boxes} boxes; per page ${p50p95(summarize(allRuns.flatMap((r) => r.pageMs)))} ms; ${LIST_REPS} walks`]);
  other.push([`list one project (${L.one_project.pages} pages)`, p50p95(summarize(oneRuns.map((r) => r.ms))) + ' ms', `${L.one_project.boxes} boxes; per page ${p50p95(summarize(oneRuns.flatMap((r) => r.pageMs)))} ms; ${LIST_REPS} walks`]);
  if (!cliNote) other.push(['box ls --all-projects (CLI, 1 page)', p50p95(summarize(cliRuns)) + ' ms', `the CLI's own start (box --version): p50 ${fmtMs(summarize(cliVersion).p50)} ms; ${CLI_REPS} runs`]);
  other.push(['host memory per idle box', `${mib(m.used_no_cache_per_box_kb).toFixed(2)} MiB`, `used without cache ${mib(memBefore.used_no_cache_kb).toFixed(0)} → ${mib(memAfter.used_no_cache_kb).toFixed(0)} MiB over ${opts.okCount} boxes (MemTotal−MemAvailable: ${mib(m.used_minus_available_per_box_kb).toFixed(2)} MiB/box; without zfs-fuse's RSS change: ${mib(m.used_no_cache_without_zfs_fuse_per_box_kb).toFixed(2)} MiB/box)`]);
  const cpuA = memBefore.idle_cpu;
  const cpuB = memAfter.idle_cpu;
  other.push(['host CPU while idle', `${cpuA.busy_cpus.toFixed(2)} → ${cpuB.busy_cpus.toFixed(2)} CPUs`, `${(((cpuB.busy_cpus - cpuA.busy_cpus) * 1000) / Math.max(1, opts.okCount)).toFixed(2)} ms of CPU a second per idle box; zfs-fuse ${cpuA.zfs_fuse_cpus.toFixed(2)} → ${cpuB.zfs_fuse_cpus.toFixed(2)}, api + node process ${cpuA.bench_process_cpus.toFixed(2)} → ${cpuB.bench_process_cpus.toFixed(2)} CPUs`]);
  other.push(['zfs-fuse RSS', `${mib(memBefore.zfs_fuse_rss_kb).toFixed(0)} → ${mib(memAfter.zfs_fuse_rss_kb).toFixed(0)} MiB`, `${m.zfs_fuse_rss_per_box_kb} KiB per box; filesystems mounted ${memBefore.zfs_fuse_mounts} → ${memAfter.zfs_fuse_mounts}${results.node_storage_restarts ? ' (the daemon was restarted in between: its RSS started afresh)' : ''}`]);
  other.push(['box cgroup memory.usage_in_bytes', `${(m.cgroup_usage_bytes.p50 / 1024).toFixed(0)} / ${(m.cgroup_usage_bytes.p95 / 1024).toFixed(0)} KiB`, `rss p50 ${(m.cgroup_rss_bytes.p50 / 1024).toFixed(0)} KiB, cache p50 ${(m.cgroup_cache_bytes.p50 / 1024).toFixed(0)} KiB; ${m.cgroups_read} cgroups, ${(m.cgroup_usage_sum_kb / 1024).toFixed(0)} MiB in all`]);
  other.push(['per box, elsewhere', `${m.processes_per_box} processes`, `bench process (api + node) RSS ${m.bench_process_rss_per_box_kb} KiB/box; kernel: ${Object.entries(m.kernel_per_box_kb).map(([k, v]) => `${k} ${v} KiB`).join(', ')}`]);
  other.push([`delete (${DELETE_CONCURRENCY} at a time)`, p50p95(summarize(deletes)) + ' ms', `${deletes.length} boxes in ${results.delete.wall_s} s`]);
  report.push(table(other));
  if (capped) report.push(`note: ${capped}`);
  if (stoppedEarly) report.push(`note: creating stopped early: ${stoppedEarly}`);
  const failedCreates = created.filter((c) => c.error);
  if (failedCreates.length) report.push(`note: ${failedCreates.length} of ${created.length} creates did not end running (first: ${failedCreates[0].project}/${failedCreates[0].name}: ${failedCreates[0].error}); zfs-fuse filesystems mounted at the end: ${memAfter.zfs_fuse_mounts} (its limit: 1000)`);
  if (results.node_storage_restarts) report.push(`note: the node's storage watchdog restarted zfs-fuse ${results.node_storage_restarts} time(s) during the scale run`);
  if (warningCount) report.push(`note: the scale host logged ${warningCount} warnings (on stderr), first: ${warnings[0]}`);
  return report;
}
