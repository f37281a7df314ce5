/** The soak's printed summary (the JSON result holds the same and more). */
import { fmtMs, table } from '../bench/stats';
import type { SoakResult } from './soak';

const lat = (l?: { p50: number; p95: number }) => (l ? `${fmtMs(l.p50)} / ${fmtMs(l.p95)}` : '-');
const kinds = (m: Record<string, number>) =>
  Object.entries(m)
    .sort((a, b) => b[1] - a[1])
    .map(([k, n]) => `${n}× ${k}`);

export function formatSummary(r: SoakResult, resultsFile?: string): string {
  const out: string[] = [''];
  const o = r.options;
  out.push(
    `boxhost soak — ${r.started_at}, ${r.machine.cpus} CPUs, ${r.machine.ram_mb} MiB, ${r.duration_s} s ` +
      `(host start ${r.host.start_s} s; ${o.rounds} rounds × ${o.boxesPerRound} boxes, creates ${o.createConcurrency}, scripts ${o.workConcurrency}, deletes ${o.deleteConcurrency} at a time, ` +
      `${o.projects} projects, ${o.keepers} keepers, seed ${o.seed})`,
  );
  out.push('');
  const rows = [['round', 's', 'boxes', 'forks', 'execs', 'stops', 'resumes', 'deletes', 'create p50/p95', 'exec p50/p95', 'delete p50/p95', 'fork p50/p95', 'keeper exec p50/p95', 'errors']];
  for (const x of r.rounds) {
    const c = x.counts;
    rows.push([
      String(x.round),
      String(x.duration_s),
      String(c.boxes ?? 0),
      String(c.forks ?? 0),
      String((c.exec ?? 0) + (c['exec-missing'] ?? 0) + (c['exec-timeout'] ?? 0)),
      String(x.latency_ms.stop?.n ?? 0),
      String(x.latency_ms.resume?.n ?? 0),
      String(c.deletes ?? 0),
      lat(x.latency_ms.create),
      lat(x.latency_ms.exec),
      lat(x.latency_ms.delete),
      lat(x.latency_ms.fork),
      lat(x.latency_ms['keeper exec']),
      String(Object.values(x.errors).reduce((a, b) => a + b, 0)),
    ]);
  }
  if (r.rounds.length) out.push(table(rows));
  for (const x of r.rounds) {
    const ops = Object.entries(x.operations)
      .map(([k, v]) => `${k} ${v.n}${v.failed ? ` (${v.failed} failed)` : ''} max ${(v.max_ms / 1000).toFixed(1)} s`)
      .join(', ');
    out.push('');
    out.push(`round ${x.round}: operations: ${ops || 'none'}; healthz ${x.healthz.status}${x.healthz.waited_s > 1 ? ` after ${x.healthz.waited_s} s` : ''}; throttled ${x.counts['throttled (429, waited out)'] ?? 0}`);
    out.push(`  provoked (expected): ${kinds(x.provoked).join(', ') || 'none'}`);
    out.push(`  errors: ${kinds(x.errors).join(', ') || 'none'}`);
    const outage = kinds(x.during_outage ?? {});
    if (outage.length) out.push(`  errors inside a storage outage the watchdog mended (not failures): ${outage.join(', ')}; 503s waited out: ${x.counts['unavailable (503 with Retry-After, waited out)'] ?? 0}`);
    const retries = kinds(x.job_retries);
    if (retries.length) out.push(`  job steps retried: ${retries.slice(0, 6).join('; ')}${retries.length > 6 ? '; …' : ''}`);
    out.push(`  watchdog: ${x.watchdog.length ? x.watchdog.slice(0, 10).join('; ') : 'nothing logged'}`);
    const left = Object.entries(x.leftovers).map(([k, v]) => `${k} ${v.length}`);
    out.push(`  leftovers: ${left.join(', ') || 'none'}`);
  }
  out.push('');
  const f = r.final;
  const left = Object.entries(f.leftovers).map(([k, v]) => `${k} ${v.length} (${v.slice(0, 3).join(', ')})`);
  out.push(
    `end: ${f.keepers_deleted} keepers deleted; leftovers ${left.join(', ') || 'none'}${f.leftovers_unchecked.length ? ` (not checked: ${f.leftovers_unchecked.join('; ')})` : ''}; ` +
      `healthz ${f.healthz.status}; watchdog ${f.watchdog.length ? f.watchdog.join('; ') : 'nothing logged'}${f.watchdog_metrics.length ? `; metrics: ${f.watchdog_metrics.join(', ')}` : ''}`,
  );
  if (r.cleanup_problems.length) out.push(`cleanup problems: ${r.cleanup_problems.join('; ')}`);
  if (r.interrupted) out.push('INTERRUPTED');
  if (r.error) out.push(`ERROR: ${r.error}`);
  out.push('');
  if (r.failures.length) {
    out.push(`FAIL: ${r.failures.length} failed checks`);
    for (const x of r.failures) out.push(`  ${x}`);
  } else {
    out.push('PASS: every operation ended, every box where it should be, no unexpected failure, nothing left, /healthz 200');
  }
  if (resultsFile) out.push(`results: ${resultsFile}`);
  return out.join('\n');
}
