/**
 * boxhost benchmark: a real host in this process (api + worker, temp data dir, its own loop-file
 * pool), measured against the raw tools in the same run.
 *
 *   1. create→running through the API (POST …/boxes?wait=60 until 200 + running)
 *      vs `zfs clone` + `runc run -d` of the same base snapshot
 *   2. exec `true` through the API (boxd forks it in the box) vs `runc exec <the same box's container> true`; the same exec
 *      through a second api process, which reaches the node through its agent (HTTP), as an api
 *      on another machine would
 *   3. fork of a box holding 1 GiB vs fork of an empty box; the same for a snapshot (POST …/snapshots, 201)
 *   4. scale (bench/scale.ts), on a second fresh host once the first is gone: 1000 boxes
 *      (1 cpu, 64 MB, 1 GB, in 2 projects of 500) created through the API 100 per batch, 10 at a
 *      time: create→running p50/p95 per hundred, the last hundred's p50 against the first's
 *      (target ≤ 1.2×, in the figure table); listing every project and one project page by page
 *      at 1000 boxes (and `box ls --all-projects`); host memory per idle box (used memory without
 *      page cache and reclaimable slab, before vs after, / 1000), zfs-fuse's RSS and each box's
 *      cgroup memory usage; delete p50, 20 at a time. On zfs-fuse, which mounts at most 1000
 *      filesystems, the boxes are capped to what it has room for (978 on an idle machine). It
 *      takes most of an hour on a 2-core machine (deletes are the slow part).
 *
 * It reports, it does not assert: the exit code is 0 whether targets are met or not (1 only when
 * the bench itself could not run). Everything it made is removed at the end, also on error. The
 * figures go to a results.json (path printed at the end; the scale ones under `scale`).
 *
 *   npm run bench        (or: npx tsc -p . && node dist/bench/main.js)
 *
 * Knobs (environment): BENCH_CREATES (20), BENCH_EXECS (200), BENCH_FORKS (5), BENCH_BIG_MB (1024),
 * BENCH_SCALE_BOXES (1000; 0 skips the scale figures), BENCH_SCALE_ONLY=1 (only the scale figures),
 * BENCH_CREATE_ONLY=1 (only the create figure, no scale: a minute or two), BENCH_FILES_ONLY=1 (the
 * create and the interactive figures: WebSocket exec, files up and down).
 *
 * This file runs the parts in order; each lives in bench/sections/ (create, exec, interactive,
 * proxy and deploy, fork and snapshot, backup), the host's setup in setup.ts, the knobs in
 * knobs.ts, the teardown in teardown.ts and the report in report.ts.
 */
import '../server/threadpool'; // first: before libuv's thread pool starts
import os from 'node:os';
import { hostLogger } from './hostLog';
import { startHost } from '../server/host';
import type { RuncRuntime } from '../workers/runtime/runc';
import type { ZfsStorage } from '../workers/storage/zfs';
import { Api } from './api';
import { readKnobs } from './knobs';
import { Profiler } from './profile';
import { figure, Figure, writeReport } from './report';
import { runScale } from './scale';
import { benchConfig, profileHost } from './setup';
import { nowMs, round1 } from './stats';
import { makeTeardown, Resources } from './teardown';
import type { SectionContext } from './sections/context';
import { createSection } from './sections/create';
import { execSection } from './sections/exec';
import { interactiveSection } from './sections/interactive';
import { deploySection, proxySection } from './sections/proxy';
import { forkSection, snapshotSection } from './sections/fork';
import { backupSection } from './sections/backup';

const knobs = readKnobs();

const progress = (msg: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 23)}] ${msg}\n`);

async function main(): Promise<number> {
  const startedAt = Date.now();
  const config = benchConfig();
  const profiler = new Profiler();
  profiler.installCommandProbe();

  // The host's log, kept in memory (for the per-operation breakdown); warnings also to stderr.
  const logs: any[] = [];
  const log = hostLogger('debug', (entry, line) => {
    logs.push(entry);
    if (entry.level >= 40 && profiler.phase !== 'teardown') process.stderr.write(`[host] ${line}\n`);
  });

  const resources: Resources = { raws: [] };
  const teardown = makeTeardown({ resources, config, profiler, progress, scaleOnly: knobs.scaleOnly });

  // A signal lets the step under way finish, then the normal path cleans up (a teardown racing
  // the bench would leave what the bench makes after it).
  let interrupted = false;
  const checkpoint = () => {
    if (interrupted) throw new Error('interrupted');
  };
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.on(sig, () => {
      if (interrupted) return progress(`${sig}: already stopping; cleaning up takes a few seconds`);
      interrupted = true;
      progress(`${sig}: stopping after the current step, then cleaning up`);
    });
  }

  const results: Record<string, any> = {
    started_at: new Date(startedAt).toISOString(),
    machine: { cpus: os.cpus().length, loadavg_start: os.loadavg().map(round1), kernel: os.release() },
    config: { data_dir: config.dataDir, creates: knobs.creates, execs: knobs.execs, forks: knobs.forks, big_mb: knobs.bigMb, scale_boxes: knobs.scaleBoxes, scale_only: knobs.scaleOnly },
  };
  const figures: Figure[] = [];
  const notes: string[] = [];
  let error: Error | undefined;

  try {
    if (!knobs.scaleOnly) {
      progress(`starting a host in ${config.dataDir}`);
      const t0 = nowMs();
      const host = (resources.host = await startHost(config, { roles: ['api', 'node'], log }));
      results.host_start_ms = round1(nowMs() - t0);
      const api = (resources.api = new Api(host.url!, host.adminToken));
      profileHost(host, profiler);
      const nodeCtx = host.node!.ctx;
      const ctx: SectionContext = {
        api,
        host,
        config,
        storage: nodeCtx.storage as ZfsStorage,
        runtime: nodeCtx.runtime as RuncRuntime,
        knobs,
        profiler,
        logs,
        figures,
        notes,
        results,
        resources,
        progress,
        checkpoint,
      };

      // 1. create → running; its first box is the exec, interactive and proxy figures' box,
      // its second the empty box the fork and snapshot figures compare with.
      const { creates, raw } = await createSection(ctx);
      if (knobs.filesOnly) await interactiveSection(ctx, creates[0]);
      else if (!knobs.createOnly) {
        const target = creates[0];
        // 2. exec; 2b. interactive: WebSocket exec, files; 2c. the publish proxy, a deploy under load
        await execSection(ctx, target, raw);
        await interactiveSection(ctx, target);
        await proxySection(ctx, target);
        if (knobs.deploySecs > 0) await deploySection(ctx);
        // 3. fork: 1 GiB vs empty; 3b. snapshot: 1 GiB vs empty; 3c. data volume backup vs zfs send
        const empty = creates[1];
        await forkSection(ctx, empty);
        await snapshotSection(ctx, empty);
        if (knobs.backupRuns > 0) await backupSection(ctx);
      }
    }
  } catch (e) {
    error = e as Error;
    progress(interrupted ? 'interrupted' : `bench failed: ${error.stack ?? error.message}`);
  }

  // ------------------------------------------------------------ teardown and report
  progress('teardown');
  const problems = await teardown();
  if (interrupted) {
    progress(`interrupted; cleaned up${problems.length ? ` with problems:\n  ${problems.join('\n  ')}` : ''}`);
    return 130;
  }

  // ------------------------------------------------------------ 4. scale, on a host of its own
  let scaleReport: string[] = [];
  if (knobs.scaleBoxes > 0 && !error && !knobs.createOnly && !knobs.filesOnly) {
    const scale = await runScale({ boxes: knobs.scaleBoxes, makeConfig: benchConfig, profiler, progress, checkpoint });
    if (interrupted) {
      progress(`interrupted; cleaned up${scale.problems.length ? ` with problems:\n  ${scale.problems.join('\n  ')}` : ''}`);
      return 130;
    }
    results.scale = scale.results;
    scaleReport = scale.report;
    problems.push(...scale.problems.map((p) => `scale: ${p}`));
    if (scale.error) error = new Error(`scale: ${scale.error.message}`);
    if (scale.firstHundred.length && scale.lastHundred.length) {
      figures.push(figure(`create→running at boxes ${scale.lastRange} vs ${scale.firstRange}`, scale.lastHundred, scale.firstHundred, `boxes ${scale.firstRange}`, scale.target));
    }
  } else if (knobs.scaleBoxes > 0 && !knobs.createOnly && !knobs.filesOnly) {
    notes.push('the scale figures did not run: the bench failed before them');
  }

  // ------------------------------------------------------------ report
  writeReport({ results, figures, notes, scaleReport, error, problems, startedAt });
  return error ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`bench crashed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
