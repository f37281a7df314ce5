/**
 * Helpers the scale run's steps share: a pause, the p50/p95 cell, KiB → MiB, a bounded-concurrency
 * loop, the operation wait and the profiler's breakdown of one phase.
 */
import type { Api } from '../api';
import type { Profiler } from '../profile';
import { fmtMs, summarize, Summary } from '../stats';

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
export const p50p95 = (s: Summary) => `${fmtMs(s.p50)} / ${fmtMs(s.p95)}`;
export const mib = (kb: number) => kb / 1024;

export async function mapLimit<T>(items: T[], limit: number, fn: (t: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(limit, queue.length) }, async () => {
      for (let it = queue.shift(); it !== undefined; it = queue.shift()) await fn(it);
    }),
  );
}

/** Waits for an operation the way `box … --wait` does when `?wait` ran out: the operation wait. */
export async function waitOp(api: Api, opId: string): Promise<any> {
  for (;;) {
    const w = await api.call('GET', `/v1/operations/${opId}/wait?timeout=300`);
    if (w.status === 200) return w.body;
    if (w.status !== 408) throw new Error(`waiting for operation ${opId} answered ${w.status}: ${w.text.slice(0, 300)}`);
  }
}

/**
 * The profiler's breakdown of one phase, with the pids in host commands' labels made one
 * (`mount /proc/3551/ns/user` → `mount /proc/<pid>/ns/user`), so that a step is one row.
 */
export function stepsOf(profiler: Profiler, phase: string, operations: number): { label: string; callsPerOp: number; p50: number; msPerOp: number }[] {
  const by = new Map<string, number[]>();
  for (const s of profiler.samples) {
    if (s.phase !== phase) continue;
    const label = s.label.replace(/\/proc\/\d+\//g, '/proc/<pid>/');
    if (!by.has(label)) by.set(label, []);
    by.get(label)!.push(s.ms);
  }
  return [...by.entries()]
    .map(([label, ms]) => ({ label, callsPerOp: ms.length / operations, p50: summarize(ms).p50, msPerOp: ms.reduce((a, b) => a + b, 0) / operations }))
    .sort((a, b) => b.msPerOp - a.msPerOp);
}
