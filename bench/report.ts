/** The bench's figures and its report: the figure table, where the time goes, results.json and
 *  the final JSON summary line. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { CreateSample } from './boxes';
import type { Profiler } from './profile';
import { fmtMs, round1, summarize, Summary, table } from './stats';

export interface Figure {
  metric: string;
  boxhost: Summary;
  floor: Summary;
  floorLabel: string;
  ratio: number;
  target: number;
  pass: boolean;
}

export function figure(metric: string, boxhost: number[], floor: number[], floorLabel: string, target: number): Figure {
  const b = summarize(boxhost);
  const f = summarize(floor);
  const ratio = b.p50 / f.p50;
  return { metric, boxhost: b, floor: f, floorLabel, ratio, target, pass: ratio <= target };
}

export function figureTable(figures: Figure[]): string {
  const rows = [['metric', 'boxhost p50/p95 (ms)', 'raw p50/p95 (ms)', 'raw =', 'ratio', 'target', 'result']];
  for (const f of figures) {
    rows.push([
      f.metric,
      `${fmtMs(f.boxhost.p50)} / ${fmtMs(f.boxhost.p95)}`,
      `${fmtMs(f.floor.p50)} / ${fmtMs(f.floor.p95)}`,
      f.floorLabel,
      `${f.ratio.toFixed(2)}x`,
      `<= ${f.target}x`,
      f.pass ? 'PASS' : 'MISS',
    ]);
  }
  return table(rows);
}

export function breakdownTable(title: string, rows: { label: string; callsPerOp: number; p50: number; msPerOp: number }[], limit = 14): string {
  const out = [['step', 'calls/op', 'p50 per call (ms)', 'ms per op']];
  for (const r of rows.slice(0, limit)) out.push([r.label, r.callsPerOp.toFixed(2), fmtMs(r.p50), fmtMs(r.msPerOp)]);
  return `${title}\n${table(out)}`;
}

export const summaryJson = (s: Summary) => ({ n: s.n, p50: round1(s.p50), p95: round1(s.p95), min: round1(s.min), max: round1(s.max), mean: round1(s.mean) });

/**
 * Splits each API create (or fork) into: request sent → the worker starts the job ('operation
 * running' log line), the job itself (→ 'operation succeeded'), and job done → the HTTP answer
 * (the `?wait` loop noticing it). Pino's `time` and Date.now() share the clock.
 */
export function opPhases(logs: any[], samples: CreateSample[]) {
  const ops = new Map<string, { running?: number; succeeded?: number; retries: number }>();
  for (const l of logs) {
    if (!l.op) continue;
    const o = ops.get(l.op) ?? { retries: 0 };
    if (l.msg === 'operation running') o.running ??= l.time;
    if (l.msg === 'operation succeeded') o.succeeded = l.time;
    if (l.msg === 'operation step failed') o.retries++;
    ops.set(l.op, o);
  }
  const toJob: number[] = [];
  const inJob: number[] = [];
  const afterJob: number[] = [];
  let retries = 0;
  for (const c of samples) {
    const o = c.opId ? ops.get(c.opId) : undefined;
    if (!o?.running || !o.succeeded) continue;
    toJob.push(o.running - c.sentAt);
    inJob.push(o.succeeded - o.running);
    afterJob.push(c.answeredAt - o.succeeded);
    retries += o.retries;
  }
  return {
    request_to_job_running: summaryJson(summarize(toJob)),
    job_running_to_succeeded: summaryJson(summarize(inJob)),
    job_succeeded_to_answer: summaryJson(summarize(afterJob)),
    job_succeeded_to_answer_samples: afterJob,
    job_retries: retries,
  };
}

export function phasesLine(ph: ReturnType<typeof opPhases>): string {
  return (
    `request→job running ${ph.request_to_job_running.p50}, job ${ph.job_running_to_succeeded.p50} (p95 ${ph.job_running_to_succeeded.p95}), ` +
    `job done→HTTP answer ${ph.job_succeeded_to_answer.p50} (p95 ${ph.job_succeeded_to_answer.p95})` +
    (ph.job_retries ? `, job retries ${ph.job_retries}` : '')
  );
}

/** A phase's host steps per operation, rounded for results.json. */
export const stepsJson = (profiler: Profiler, phase: string, ops: number) =>
  profiler.breakdown(phase, ops).map((r) => ({ ...r, p50: round1(r.p50), msPerOp: round1(r.msPerOp), callsPerOp: round1(r.callsPerOp) }));

/**
 * Completes the results (figures, problems, error, end load, duration), writes results.json and
 * prints the report, then the one-line JSON summary.
 */
export function writeReport(opts: { results: Record<string, any>; figures: Figure[]; notes: string[]; scaleReport: string[]; error: Error | undefined; problems: string[]; startedAt: number }): void {
  const { results, figures, notes, scaleReport, error, problems, startedAt } = opts;
  results.cleanup_problems = problems;
  results.error = error ? error.message : null;
  results.figures = figures.map((f) => ({
    metric: f.metric,
    boxhost: summaryJson(f.boxhost),
    floor: summaryJson(f.floor),
    floor_is: f.floorLabel,
    ratio: Math.round(f.ratio * 100) / 100,
    target: f.target,
    result: f.pass ? 'PASS' : 'MISS',
  }));
  results.loadavg_end = os.loadavg().map(round1);
  results.duration_s = round1((Date.now() - startedAt) / 1000);
  const resultsDir = fs.mkdtempSync(path.join(os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir(), 'boxhost-bench-'));
  const resultsFile = path.join(resultsDir, 'results.json');
  fs.writeFileSync(resultsFile, JSON.stringify(results, null, 2));

  const out: string[] = [''];
  out.push(`boxhost bench — ${results.started_at}, ${os.cpus().length} CPUs, load ${results.machine.loadavg_start.join(' ')}, ${results.duration_s} s`);
  out.push('');
  if (figures.length) out.push(figureTable(figures));
  if (results.create) {
    const c = results.create;
    const ph = c.api_phases_ms;
    out.push('');
    out.push(`create→running, where the API time goes (p50 ms): ${phasesLine(ph)}; runc run inside runtime.start ${ph.runc_run_in_runtime_start.p50}`);
    out.push(`raw floor steps (p50 ms): zfs clone ${c.raw_steps.zfs_clone.p50}, config.json ${c.raw_steps.bundle_write.p50}, runc run -d ${c.raw_steps.runc_run_d.p50}`);
    out.push(breakdownTable('host steps per create (driver methods and every host command they ran; nested: methods include their commands)', c.api_steps, 24));
  }
  if (results.exec) {
    out.push('');
    out.push(breakdownTable('host steps per API exec', results.exec.api_steps, 12));
  }
  if (results.fork) {
    out.push('');
    out.push(`fork of the big box, where the time goes (p50 ms): ${phasesLine(results.fork.big_phases_ms)}`);
    out.push(`fork of the empty box, where the time goes (p50 ms): ${phasesLine(results.fork.empty_phases_ms)}`);
    const jb = results.fork.big_phases_ms.job_running_to_succeeded.p50;
    const je = results.fork.empty_phases_ms.job_running_to_succeeded.p50;
    out.push(`fork job time alone (worker running→succeeded), big vs empty: ${jb} / ${je} ms = ${(jb / je).toFixed(2)}x`);
    out.push(breakdownTable('host steps per fork of the big box', results.fork.big_steps, 10));
    out.push(breakdownTable('host steps per fork of the empty box', results.fork.empty_steps, 10));
  }
  if (scaleReport.length) {
    out.push('');
    out.push(...scaleReport);
  }
  for (const n of notes) out.push(`note: ${n}`);
  if (error) out.push(`ERROR: the bench did not finish: ${error.message}`);
  if (problems.length) out.push(`cleanup problems:\n  ${problems.join('\n  ')}`);
  out.push('');
  out.push(`results: ${resultsFile}`);
  process.stdout.write(`${out.join('\n')}\n`);
  process.stdout.write(
    `${JSON.stringify({ results: resultsFile, error: results.error, figures: results.figures.map((f: any) => ({ metric: f.metric, boxhost_p50: f.boxhost.p50, boxhost_p95: f.boxhost.p95, raw_p50: f.floor.p50, raw_p95: f.floor.p95, ratio: f.ratio, target: f.target, result: f.result })) })}\n`,
  );
}
