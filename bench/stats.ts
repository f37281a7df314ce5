/** Small statistics helpers for the bench (nearest-rank percentiles, no interpolation). */

export interface Summary {
  n: number;
  p50: number;
  p95: number;
  min: number;
  max: number;
  mean: number;
}

/** Nearest-rank percentile: the smallest sample with at least p% of the samples at or below it. */
export function percentile(samples: number[], p: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

export function summarize(samples: number[]): Summary {
  const n = samples.length;
  return {
    n,
    p50: percentile(samples, 50),
    p95: percentile(samples, 95),
    min: n ? Math.min(...samples) : NaN,
    max: n ? Math.max(...samples) : NaN,
    mean: n ? samples.reduce((a, b) => a + b, 0) / n : NaN,
  };
}

export const round1 = (x: number) => Math.round(x * 10) / 10;

export function fmtMs(x: number): string {
  if (!Number.isFinite(x)) return '-';
  return x >= 100 ? x.toFixed(0) : x.toFixed(1);
}

/** Milliseconds since an arbitrary origin, sub-millisecond resolution. */
export const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

/** Renders rows as a plain text table (first row = header). */
export function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length)));
  const line = (r: string[]) => r.map((cell, c) => (cell ?? '').padEnd(widths[c])).join('  ').trimEnd();
  const sep = widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(rows[0]), sep, ...rows.slice(1).map(line)].join('\n');
}
