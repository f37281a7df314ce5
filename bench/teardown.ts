/** What the bench made, and its removal at the end (also on error or a signal). */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import type { Config } from '../core/config';
import type { Host } from '../server/host';
import { cleanupHost } from '../test/helpers/cleanup';
import type { Api } from './api';
import { deleteBox } from './boxes';
import { PROJECT } from './knobs';
import type { Profiler } from './profile';
import type { RawRunner } from './raw';

/** Filled in as the bench makes things; the teardown removes what is there. */
export interface Resources {
  host?: Host;
  api?: Api;
  /** The raw floors' runners, cleaned up in this order. */
  raws: RawRunner[];
  remoteApi?: ChildProcess;
}

async function mapLimit<T>(items: T[], limit: number, fn: (t: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(limit, queue.length) }, async () => {
      for (let it = queue.shift(); it !== undefined; it = queue.shift()) await fn(it);
    }),
  );
}

/** The teardown, run at most once (a second call gets the first one's problems). */
export function makeTeardown(opts: { resources: Resources; config: Config; profiler: Profiler; progress: (msg: string) => void; scaleOnly: boolean }): () => Promise<string[]> {
  const { resources: res, config, profiler, progress, scaleOnly } = opts;
  let teardownDone: Promise<string[]> | undefined;
  return () =>
    (teardownDone ??= (async () => {
      profiler.phase = 'teardown';
      const problems: string[] = [];
      const step = async (what: string, fn: () => Promise<unknown>) => {
        try {
          await fn();
        } catch (e) {
          problems.push(`${what}: ${(e as Error).message}`);
        }
      };
      if (res.api) {
        const a = res.api;
        await step('delete boxes', async () => {
          const list = await a.call('GET', `/v1/projects/${PROJECT}/boxes?max_results=1000`);
          const names: string[] = (list.body?.boxes ?? []).map((b: any) => b.name);
          progress(`teardown: deleting ${names.length} boxes through the API`);
          await mapLimit(names, 4, (n) => deleteBox(a, n).catch((e) => void problems.push(String(e))));
        });
      }
      if (res.remoteApi && res.remoteApi.exitCode === null) res.remoteApi.kill('SIGKILL');
      for (const r of res.raws) await step('raw cleanup', async () => problems.push(...(await r.cleanup())));
      if (res.host) {
        const h = res.host;
        await step('host close', () => h.close());
      }
      // With BENCH_SCALE_ONLY this host never started: only its empty data dir is there.
      if (scaleOnly && !res.host) await step('removing the data dir', async () => fs.rmSync(config.dataDir, { recursive: true, force: true }));
      else await step('cleanupHost', () => cleanupHost(config));
      return problems;
    })());
}
