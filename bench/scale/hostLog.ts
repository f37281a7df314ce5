/**
 * The scale host's log: only the operations' lines are kept (for where a create's time goes),
 * with the node's storage watchdog's events; warnings are counted and also go to stderr.
 */
import type pino from 'pino';
import { hostLogger } from '../hostLog';
import type { Profiler } from '../profile';

export interface ScaleHostLog {
  log: pino.Logger;
  /** Per operation id: when its job ran and succeeded, and its steps that failed (retried). */
  opLog: Map<string, { running?: number; succeeded?: number; retries: number }>;
  /** The node's storage watchdog at work (docs/decisions.md "Storage watchdog"): when, what. */
  storageEvents: { time: number; msg: string }[];
  /** The first 20 warnings. */
  warnings: string[];
  warningCount: number;
}

export function scaleHostLog(profiler: Profiler): ScaleHostLog {
  // The host's log: only the operations' lines are kept (for where a create's time goes);
  // warnings also go to stderr.
  const keep = new Set(['operation running', 'operation succeeded', 'operation step failed']);
  const out: Omit<ScaleHostLog, 'log'> = { opLog: new Map(), storageEvents: [], warnings: [], warningCount: 0 };
  const log = hostLogger('info', (e, line) => {
    if (e.op && keep.has(e.msg)) {
      const o = out.opLog.get(e.op) ?? { retries: 0 };
      if (e.msg === 'operation running') o.running ??= e.time;
      if (e.msg === 'operation succeeded') o.succeeded = e.time;
      if (e.msg === 'operation step failed') o.retries++;
      out.opLog.set(e.op, o);
    }
    if (e.part === 'storage-watchdog' || e.part === 'storage-recovery' || e.msg === 'killed the zfs-fuse daemon') out.storageEvents.push({ time: e.time, msg: e.msg });
    if (e.level >= 40 && profiler.phase !== 'teardown') {
      if (out.warnings.length < 20) out.warnings.push(`${e.msg}${e.err ? `: ${String(e.err.message ?? e.err).slice(0, 200)}` : ''}`);
      out.warningCount++;
      process.stderr.write(`[scale host] ${line}\n`);
    }
  });
  return Object.assign(out, { log });
}
