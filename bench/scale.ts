/**
 * Scale figures (issue 13), on a host of their own (fresh data dir, pool, subnet) started after
 * the other figures' host is gone, so neither disturbs the other:
 *
 *   - create→running of N boxes (BENCH_SCALE_BOXES, 1000) on one node through the HTTP API, as
 *     a user makes them (POST …/boxes?wait=300, then the operation wait if that runs out), in
 *     batches of 100, 10 creates in flight at a time: p50/p95 per hundred and the ratio of the
 *     last hundred's p50 to the first's (target ≤ 1.2×), with where a create's time goes per
 *     hundred (the worker's job vs the api around it, and the host steps that grew most)
 *   - the raw tools' own growth: `zfs clone` + the remount + `runc run -d`, 10 at a time, with no
 *     api, queue or network, after the first hundred and again with all N idle (rawFloor.ts):
 *     how much of the create's growth is the storage daemon's and runc's
 *   - listing at N boxes: every project (`GET /v1/projects/-/boxes`) and one project, each walked
 *     page by page with the api's own page size and continuation token, 20 times; and
 *     `box ls --all-projects` (the CLI, one page) a few times
 *   - host memory per idle box: used memory without the page cache and reclaimable slab
 *     (MemTotal − MemFree − Buffers − Cached − SReclaimable; caches are never dropped) before the
 *     first create and after all N run, each the median of 10 snapshots a second apart while
 *     the host idles, the difference divided by N; the zfs-fuse daemon's RSS before and after;
 *     each box's cgroup `memory.usage_in_bytes` (p50). The figure is machine-wide: whatever
 *     else runs on the machine meanwhile moves it (by ±0.2 MiB per box for ±200 MiB)
 *   - deleting them all, 20 at a time: p50/p95; then the host is closed and cleaned up
 *     (test/helpers/cleanup.ts), which reports anything left
 *
 * The boxes are the smallest the api takes (1 cpu, 64 MB, 1 GB), spread round-robin over
 * projects of at most 500 (2 for 1000), so they fit a project's address block whatever
 * BOXHOST_PROJECT_PREFIX is (a /24 holds 253, the /22 default 1021).
 *
 * On zfs-fuse there are fewer: the daemon mounts at most 1000 filesystems machine-wide (fewer if
 * its ARC is small: ROOTS_PER_ARC_MB), the host mounts 11 of its own and the node keeps 16
 * spare, so the boxes are capped as the node's admission caps them (972 on an otherwise idle
 * machine; the report says so). Past the limit a root is made but never mounted, and
 * zfs-fuse keeps it "busy" until the daemon restarts: the box, and then its pool, cannot be
 * destroyed.
 *
 * This file runs the steps in order and cleans up (on an error too); each step lives in
 * bench/scale/: the run's fixed shape (shape.ts), how many boxes and the host config that admits
 * them (capacity.ts), the host's log (hostLog.ts), the creates (create.ts), the raw floor
 * (rawFloor.ts), memory (memory.ts),
 * the lists (list.ts), the deletes (delete.ts) and the printed report (report.ts).
 */
import type { Config } from '../core/config';
import { startHost, Host } from '../server/host';
import { cleanupHost } from '../test/helpers/cleanup';
import type { RuncRuntime } from '../workers/runtime/runc';
import { operationsRepo } from '../db/repos/operations';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import type { Profiler } from './profile';
import { fmtMs, round1 } from './stats';
import { Api } from './api';
import { scaleHostEnv, sizeScale } from './scale/capacity';
import { createFigures, createInBatches } from './scale/create';
import { deleteAll, deleteLeft } from './scale/delete';
import { scaleHostLog } from './scale/hostLog';
import { measureLists } from './scale/list';
import { memoryPerBox, settledMemory, waitUntilSettled } from './scale/memory';
import { rawFloorAt, RawFloor } from './scale/rawFloor';
import { scaleReport } from './scale/report';
import { BATCH, CREATE_CONCURRENCY, DELETE_CONCURRENCY, IDLE_SETTLE_MS, SCALE_TARGET, SMALL } from './scale/shape';

export interface ScaleOptions {
  /** How many boxes (> 0). */
  boxes: number;
  /** The bench's host config with these variables added. */
  makeConfig: (env: Record<string, string>) => Config;
  /** The bench's profiler (its command probe is installed once per process). */
  profiler: Profiler;
  progress: (msg: string) => void;
  /** Throws once the bench was interrupted. */
  checkpoint: () => void;
}

export interface ScaleOutcome {
  /** For the bench's JSON results, under `scale`. */
  results: Record<string, any>;
  /** Lines of the printed report. */
  report: string[];
  /** create→running samples (ms) of the first and the last hundred, for the figure table. */
  firstHundred: number[];
  lastHundred: number[];
  /** Which boxes those are: `0–100`, `900–1000`. */
  firstRange: string;
  lastRange: string;
  /** The most the last hundred's create p50 may be, in first hundred's p50s. */
  target: number;
  problems: string[];
  error?: Error;
}

export async function runScale(opts: ScaleOptions): Promise<ScaleOutcome> {
  const { profiler, progress, checkpoint } = opts;
  const startedAt = Date.now();
  const { N, capped, projectPrefix, perProject, mountedBefore } = sizeScale(opts.boxes, opts.makeConfig);
  if (N < 1) {
    return { results: { boxes: N, asked: opts.boxes, error: capped }, report: [`scale: skipped: ${capped}`], firstHundred: [], lastHundred: [], firstRange: '', lastRange: '', target: SCALE_TARGET, problems: [], error: new Error(`scale: ${capped}`) };
  }
  const nProjects = Math.max(1, Math.ceil(N / perProject));
  const config = opts.makeConfig(scaleHostEnv(N, perProject));
  const projects = Array.from({ length: nProjects }, (_, p) => `scale-${p}`);
  const projectOf = (i: number) => projects[i % nProjects];
  const nameOf = (i: number) => `s${String(i).padStart(String(N).length, '0')}`;
  const hostLog = scaleHostLog(profiler);

  const results: Record<string, any> = {
    boxes: N,
    asked: opts.boxes,
    capped,
    fuse_mounts_before: mountedBefore,
    projects: nProjects,
    boxes_per_project: Math.ceil(N / nProjects),
    project_prefix: projectPrefix,
    box_config: SMALL,
    batch: BATCH,
    create_concurrency: CREATE_CONCURRENCY,
    delete_concurrency: DELETE_CONCURRENCY,
    data_dir: config.dataDir,
    box_subnet: config.boxSubnet,
  };
  const report: string[] = [];
  const problems: string[] = [];
  let host: Host | undefined;
  let api: Api | undefined;
  let error: Error | undefined;

  try {
    progress(`scale: starting a host in ${config.dataDir} for ${N} boxes in ${nProjects} project${nProjects === 1 ? '' : 's'} (${results.boxes_per_project} each, project block /${projectPrefix})`);
    host = await startHost(config, { roles: ['api', 'node'], log: hostLog.log });
    api = new Api(host.url!, host.adminToken);
    const ctx = host.node!.ctx;
    const runtime = ctx.runtime as RuncRuntime;
    profiler.wrap(ctx.storage, 'storage', ['createBoxRoot', 'prepareBoxRoot', 'destroyBoxRoot']);
    profiler.wrap(ctx.network, 'network', ['attach', 'detach', 'releaseProject']);
    profiler.wrap(ctx.runtime, 'runtime', ['start', 'ownsNetns', 'makeNetns', 'writeEnvironment', 'remove', 'stop', 'status']);
    // Module objects: wrapped once per process (the other figures' run may have done it).
    profiler.wrap(operationsRepo, 'db operations', ['get', 'insert', 'update', 'earlierUnfinished']);
    profiler.wrap(boxesRepo, 'db boxes', Object.keys(boxesRepo));
    profiler.wrap(projectsRepo, 'db projects', Object.keys(projectsRepo));
    if (host.api) profiler.wrap(host.api.queue, 'api queue', ['enqueue', 'waitFor']);

    // ------------------------------------------------------------ memory before
    profiler.phase = 'scale-settle';
    const memBefore = await settledMemory();
    results.memory_before = memBefore;

    // ------------------------------------------------------------ creates
    // The raw floor after the first batch and again with every box (its own growth).
    const h = host;
    const floors: RawFloor[] = [];
    let floorRuns = 0;
    const measureFloor = async (boxes: number) => {
      profiler.phase = 'scale-raw-floor';
      try {
        floors.push(await rawFloorAt({ host: h, project: projects[0], boxes, label: `${floorRuns++}`, problems }));
        const f = floors[floors.length - 1];
        progress(`scale: raw floor at ${boxes} boxes (clone + remount + runc run -d, ${CREATE_CONCURRENCY} at a time): p50 ${fmtMs(f.total.p50)} ms (clone ${fmtMs(f.clone.p50)}, run ${fmtMs(f.run.p50)})`);
      } catch (e) {
        problems.push(`raw floor at ${boxes} boxes: ${(e as Error).message}`);
      }
    };
    const { hundreds, created, stoppedEarly } = await createInBatches({ api, N, projectOf, nameOf, profiler, progress, checkpoint, afterFirstBatch: measureFloor });
    results.create_stopped_early = stoppedEarly;
    const ok = created.filter((c) => !c.error);
    results.create_failures = created.filter((c) => c.error).map((c) => `${c.project}/${c.name}: ${c.error}`);
    const creates = createFigures(hundreds, ok, hostLog, profiler);
    results.create = creates.json;

    // ------------------------------------------------------------ memory after, idle
    checkpoint();
    profiler.phase = 'scale-idle';
    results.settle_before_memory_s = round1((await waitUntilSettled(api, created, problems)) / 1000);
    progress(`scale: ${ok.length} boxes running; idling ${IDLE_SETTLE_MS / 1000} s before measuring memory`);
    const memAfter = await settledMemory();
    results.memory_after = memAfter;
    results.memory = memoryPerBox(memBefore, memAfter, ok, runtime);
    // The floor again with every box there and idle (after the memory's settle).
    if (!stoppedEarly && floors.length === 1) await measureFloor(ok.length);
    results.raw_floor = floors;
    let floorLine: string | null = null;
    if (floors.length === 2) {
      const [a, b] = floors;
      floorLine = `the raw tools' own growth (zfs clone + remount + runc run -d, ${CREATE_CONCURRENCY} at a time, no api): p50 ${fmtMs(a.total.p50)} ms at ${a.boxes} boxes → ${fmtMs(b.total.p50)} ms at ${b.boxes} idle (${(b.total.p50 / a.total.p50).toFixed(2)}x; clone ${fmtMs(a.clone.p50)} → ${fmtMs(b.clone.p50)}, run ${fmtMs(a.run.p50)} → ${fmtMs(b.run.p50)})`;
    }

    // ------------------------------------------------------------ lists at N boxes
    checkpoint();
    profiler.phase = 'scale-list';
    const lists = await measureLists({ api, project: projects[0], created, problems, progress, checkpoint });
    results.list = lists.json;

    // ------------------------------------------------------------ deletes
    checkpoint();
    const nodeRow = await api.call('GET', '/v1/nodes/local');
    results.node_storage_restarts = nodeRow.body?.storage_restarts ?? null;
    profiler.phase = 'scale-delete';
    const { deletes, json: deleteJson } = await deleteAll({ api, boxes: lists.all.boxes, profiler, problems, progress });
    results.delete = deleteJson;

    // ------------------------------------------------------------ report
    report.push(...scaleReport({ N, nProjects, results, creates, lists, memBefore, memAfter, okCount: ok.length, created, deletes, capped, stoppedEarly, hostLog }));
    if (floorLine) report.push(floorLine);
    results.host_warnings = { count: hostLog.warningCount, first: hostLog.warnings };
    results.storage_events = hostLog.storageEvents.map((ev) => ({ at_s: round1((ev.time - startedAt) / 1000), msg: ev.msg }));
    results.first_hundred = creates.first.create;
    results.last_hundred = creates.last.create;
    return finish(
      hundreds[0].samples.filter((c) => !c.error).map((c) => c.ms),
      hundreds[hundreds.length - 1].samples.filter((c) => !c.error).map((c) => c.ms),
      creates.first.range,
      creates.last.range,
    );
  } catch (e) {
    error = e as Error;
    progress(`scale: ${error.message}`);
    return finish([], [], '', '');
  }

  async function finish(firstHundred: number[], lastHundred: number[], firstRange: string, lastRange: string): Promise<ScaleOutcome> {
    profiler.phase = 'teardown';
    const step = async (what: string, fn: () => Promise<unknown>) => {
      try {
        await fn();
      } catch (e) {
        problems.push(`${what}: ${(e as Error).message}`);
      }
    };
    if (error && api) {
      // The normal path deleted every box; after an error whatever is there goes the same way.
      const a = api;
      await step('delete boxes', () => deleteLeft(a, problems, progress));
    }
    if (host) {
      const h = host;
      await step('host close', () => h.close());
    }
    await step('cleanupHost', async () => problems.push(...(await cleanupHost(config))));
    results.cleanup_problems = problems;
    results.error = error ? error.message : null;
    results.duration_s = round1((Date.now() - startedAt) / 1000);
    return { results, report, firstHundred, lastHundred, firstRange, lastRange, target: SCALE_TARGET, problems, error };
  }
}
