/**
 * In-process profiling of the host under bench, without touching its code: every host command
 * the drivers spawn through core/command's `run` is timed (the module export is wrapped; the
 * compiled drivers call it through the module object), and chosen driver methods are wrapped
 * on their instances. Samples carry the bench phase they ran in.
 */
import path from 'node:path';
import * as command from '../core/command';
import { nowMs, summarize } from './stats';

export interface Sample {
  phase: string;
  label: string;
  ms: number;
}

export class Profiler {
  phase = 'setup';
  readonly samples: Sample[] = [];

  record(label: string, ms: number): void {
    this.samples.push({ phase: this.phase, label, ms });
  }

  /** Times every `run([...])` of core/command from now on. */
  installCommandProbe(): void {
    const mod = command as unknown as { run: typeof command.run };
    const original = mod.run;
    if ((original as any).__benchProbe) return;
    const probe = ((argv: string[], opts?: command.RunOptions) => {
      const t0 = nowMs();
      const label = commandLabel(argv, opts);
      // Filed under the phase it started in (a command may end in the next one).
      const phase = this.phase;
      const done = () => this.samples.push({ phase, label: `cmd ${label}`, ms: nowMs() - t0 });
      return original(argv, opts).then(
        (r) => {
          done();
          return r;
        },
        (e) => {
          done();
          throw e;
        },
      );
    }) as typeof command.run;
    (probe as any).__benchProbe = true;
    mod.run = probe;
  }

  /** Replaces `obj[name]` for each name by a timed wrapper (same `this`, same result). */
  wrap(obj: object, prefix: string, names: string[]): void {
    const target = obj as Record<string, any>;
    for (const name of names) {
      const original = target[name];
      // Already timed (a module object wrapped by an earlier host of the same run): once is enough.
      if (typeof original !== 'function' || original.__benchWrapped) continue;
      const self = this;
      const wrapped = function (this: unknown, ...args: unknown[]) {
        const t0 = nowMs();
        const label = `${prefix}.${name}`;
        let result: unknown;
        try {
          result = original.apply(this, args);
        } catch (e) {
          self.record(label, nowMs() - t0);
          throw e;
        }
        if (result && typeof (result as Promise<unknown>).then === 'function') {
          return (result as Promise<unknown>).then(
            (v) => {
              self.record(label, nowMs() - t0);
              return v;
            },
            (e) => {
              self.record(label, nowMs() - t0);
              throw e;
            },
          );
        }
        self.record(label, nowMs() - t0);
        return result;
      };
      (wrapped as any).__benchWrapped = true;
      target[name] = wrapped;
    }
  }

  /** Per label in one phase: calls per operation, p50 and total time per operation. */
  breakdown(phase: string, operations: number): { label: string; callsPerOp: number; p50: number; msPerOp: number }[] {
    const by = new Map<string, number[]>();
    for (const s of this.samples) {
      if (s.phase !== phase) continue;
      if (!by.has(s.label)) by.set(s.label, []);
      by.get(s.label)!.push(s.ms);
    }
    return [...by.entries()]
      .map(([label, ms]) => ({
        label,
        callsPerOp: ms.length / operations,
        p50: summarize(ms).p50,
        msPerOp: ms.reduce((a, b) => a + b, 0) / operations,
      }))
      .sort((a, b) => b.msPerOp - a.msPerOp);
  }
}

/** `zfs clone`, `runc state`, `ip netns`, `cni bridge ADD`, …: the tool and its verb. */
export function commandLabel(argv: string[], opts?: command.RunOptions): string {
  const tool = path.basename(argv[0]);
  const rest = argv.slice(1);
  if (opts?.env?.CNI_COMMAND) return `cni ${tool} ${opts.env.CNI_COMMAND}`;
  const withValue = new Set(['--root', '--log', '--log-format', '-n', '--pid-file', '--cwd']);
  const words: string[] = [];
  for (let i = 0; i < rest.length && words.length < (tool === 'ip' ? 2 : 1); i++) {
    const a = rest[i];
    if (withValue.has(a)) {
      i++;
      continue;
    }
    if (a.startsWith('-')) continue;
    words.push(a);
  }
  return [tool, ...words].join(' ');
}
