/**
 * 1. create→running through the API (POST …/boxes?wait=60 until 200 + running) vs `zfs clone` +
 *    `runc run -d` of the same base snapshot, with and without the user namespace mapping, and
 *    with the same storage work a box's root gets.
 */
import { createBox, CreateSample, zfsGet } from '../boxes';
import { PROJECT, TARGETS } from '../knobs';
import { boxStorageWork, busyboxFloorBase, RawRunner } from '../raw';
import { figure, Figure, opPhases, stepsJson, summaryJson } from '../report';
import { fmtMs, round1, summarize } from '../stats';
import type { SectionContext } from './context';

/** The API's creates (boxes c-1…c-N) and the raw runner the exec floor reuses. */
export interface CreateOutcome {
  creates: CreateSample[];
  raw: RawRunner;
  figure: Figure;
}

export async function createSection(ctx: SectionContext): Promise<CreateOutcome> {
  const { api, host, config, storage, knobs, profiler, logs, figures, notes, results, resources, progress, checkpoint } = ctx;
  progress(`create→running: ${knobs.creates} boxes through the API, interleaved with ${knobs.creates} raw clone + runc run -d in the same user namespace mapping, and as many without one (after 1 warm-up each)`);
  profiler.phase = 'create-warmup';
  // The project's first box makes the base's copy in its id range, which the raw floor clones too.
  const first = await createBox(api, 'c-0');
  const shiftLog = logs.find((l) => l.msg === "made a base's copy in an id range");
  const { idMap, shiftedSnapshot: baseSnapshot, plainSnapshot } = await busyboxFloorBase(host.db, storage.root, PROJECT);
  const raw = new RawRunner({ dataDir: config.dataDir, hostTag: config.hostTag, zfsRoot: storage.root, baseSnapshot, idMap });
  const rawPlain = new RawRunner({ dataDir: config.dataDir, hostTag: config.hostTag, zfsRoot: storage.root, baseSnapshot: plainSnapshot, name: 'plain' });
  // The floor doing the same storage work a box's root gets (for the note on where the gap is).
  const rawSame = new RawRunner({ dataDir: config.dataDir, hostTag: config.hostTag, zfsRoot: storage.root, baseSnapshot, idMap, name: 'same', sameStorageWork: boxStorageWork(2) });
  resources.raws.push(raw, rawPlain, rawSame);
  await raw.prepare();
  await rawPlain.prepare();
  await rawSame.prepare();
  checkpoint();
  results.zfs = { root: storage.root, base_snapshot: baseSnapshot, compression: await zfsGet('compression', storage.root) };
  results.userns = { id_map: idMap, first_create_ms: round1(first.ms), base_shift_ms: shiftLog?.ms ?? null, base_shift_entries: shiftLog?.entries ?? null };
  await raw.createAndRun(0);
  await rawPlain.createAndRun(0);
  await rawSame.createAndRun(0);
  profiler.phase = 'create';
  const creates: CreateSample[] = [];
  const rawCreates: Awaited<ReturnType<RawRunner['createAndRun']>>[] = [];
  const plainCreates: Awaited<ReturnType<RawRunner['createAndRun']>>[] = [];
  const sameCreates: Awaited<ReturnType<RawRunner['createAndRun']>>[] = [];
  for (let i = 1; i <= knobs.creates; i++) {
    checkpoint();
    creates.push(await createBox(api, `c-${i}`));
    rawCreates.push(await raw.createAndRun(i));
    plainCreates.push(await rawPlain.createAndRun(i));
    sameCreates.push(await rawSame.createAndRun(i));
  }
  const sameP50 = summarize(sameCreates.map((r) => r.totalMs)).p50;
  notes.push(
    `the raw floor doing the same storage work (clone with quota, refquota and id range, then the nosuid,nodev remount): p50 ${fmtMs(sameP50)} ms; ` +
      `create is ${(summarize(creates.map((c) => c.ms)).p50 / sameP50).toFixed(2)}x that (the rest: the api, the queue, the network, the box's namespaces)`,
  );
  const fig = figure(`create→running (${knobs.creates} boxes)`, creates.map((c) => c.ms), rawCreates.map((r) => r.totalMs), 'zfs clone + runc run -d (userns)', TARGETS.create);
  figures.push(fig);
  const usernsCost = summarize(rawCreates.map((r) => r.runMs)).p50 - summarize(plainCreates.map((r) => r.runMs)).p50;
  notes.push(
    `user namespaces: raw runc run -d p50 ${fmtMs(summarize(rawCreates.map((r) => r.runMs)).p50)} ms with, ${fmtMs(summarize(plainCreates.map((r) => r.runMs)).p50)} ms without (${usernsCost.toFixed(1)} ms); ` +
      `boxhost makes each box's user and network namespaces beside the clone (runtime.makeNetns in the table); the project's first box shifted the base (${shiftLog?.entries ?? '?'} entries) in ${shiftLog?.ms ?? '?'} ms and took ${fmtMs(first.ms)} ms`,
  );

  const runcRunMs = logs.filter((l) => l.msg === 'runc run' && typeof l.ms === 'number').map((l) => l.ms as number);
  results.create = {
    api: summaryJson(summarize(creates.map((c) => c.ms))),
    raw: summaryJson(summarize(rawCreates.map((r) => r.totalMs))),
    raw_without_userns: summaryJson(summarize(plainCreates.map((r) => r.totalMs))),
    raw_same_storage_work: summaryJson(summarize(sameCreates.map((r) => r.totalMs))),
    raw_steps: {
      zfs_clone: summaryJson(summarize(rawCreates.map((r) => r.cloneMs))),
      bundle_write: summaryJson(summarize(rawCreates.map((r) => r.bundleMs))),
      runc_run_d: summaryJson(summarize(rawCreates.map((r) => r.runMs))),
    },
    api_phases_ms: { ...opPhases(logs, creates), runc_run_in_runtime_start: summaryJson(summarize(runcRunMs.slice(-knobs.creates))) },
    api_steps: stepsJson(profiler, 'create', knobs.creates),
  };
  progress(`create done: api p50 ${fmtMs(fig.boxhost.p50)} ms, raw p50 ${fmtMs(fig.floor.p50)} ms`);
  return { creates, raw, figure: fig };
}
