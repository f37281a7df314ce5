/**
 * 3. fork of a box holding 1 GiB (BENCH_BIG_MB) vs fork of an empty box; 3b. the same for a
 *    snapshot (POST …/snapshots, 201).
 */
import { createBox, CreateSample, deleteBox, execApi, zfsGet } from '../boxes';
import { PROJECT, TARGETS } from '../knobs';
import { figure, Figure, opPhases, stepsJson, summaryJson } from '../report';
import { fmtMs, nowMs, round1, summarize } from '../stats';
import type { SectionContext } from './context';

/** The box the fork and snapshot figures fill with BENCH_BIG_MB. */
const BIG = 'big';

const sizeLabel = (mb: number) => (mb >= 1024 ? `${mb / 1024} GiB` : `${mb} MiB`);

/** Makes box "big" and fills it, then forks it and `empty` (a box of the create figure) in turn. */
export async function forkSection(ctx: SectionContext, empty: CreateSample): Promise<Figure> {
  const { api, storage, knobs, profiler, logs, figures, notes, results, progress, checkpoint } = ctx;
  checkpoint();
  profiler.phase = 'fork-setup';
  progress(`fork: making box "big" and writing ${knobs.bigMb} MiB into it`);
  const big = await createBox(api, BIG, { config: { storage_gb: Math.max(10, Math.ceil((knobs.bigMb * 2) / 1024)) } });
  const bigDs = `${storage.root}/boxes/${big.box.id}`;
  const compression = await zfsGet('compression', bigDs);
  // Zeros are stored as written when compression is off; with it on they would vanish.
  const source = compression === 'off' ? '/dev/zero' : '/dev/urandom';
  const w0 = nowMs();
  const wr = await execApi(api, BIG, ['/bin/sh', '-c', `dd if=${source} of=/root/big bs=1048576 count=${knobs.bigMb} 2>&1 && sync`], 900);
  if (wr.body.exit_code !== 0) throw new Error(`writing ${knobs.bigMb} MiB failed (exit ${wr.body.exit_code}): ${wr.body.stdout} ${wr.body.stderr}`);
  const writeMs = nowMs() - w0;
  checkpoint();
  // Wait until ZFS has the data on disk (referenced counts committed blocks only).
  const want = knobs.bigMb * 1024 * 1024 * 0.98;
  let referenced = 0;
  const settle0 = nowMs();
  while (nowMs() - settle0 < 90_000) {
    referenced = Number(await zfsGet('referenced', bigDs));
    if (referenced >= want) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const settleMs = nowMs() - settle0;
  if (referenced < want) notes.push(`the big box references only ${(referenced / 2 ** 20).toFixed(0)} MiB after ${fmtMs(settleMs)} ms`);
  // One more txg interval so that nothing of the write is still in flight when forks start.
  await new Promise((r) => setTimeout(r, 5000));
  results.fork_setup = { source, compression, write_ms: round1(writeMs), settle_ms: round1(settleMs), big_referenced_bytes: referenced, big_box: big.box.id, empty_box: empty.box.id };
  progress(`wrote ${knobs.bigMb} MiB from ${source} in ${fmtMs(writeMs)} ms (compression ${compression}; on disk after ${fmtMs(settleMs)} ms more: ${(referenced / 2 ** 20).toFixed(0)} MiB)`);

  progress(`fork: ${knobs.forks} forks of "big" and of "${empty.name}" (empty), interleaved, each fork deleted before the next (after 1 warm-up each)`);
  const forkSamples: Record<string, CreateSample[]> = {};
  const forkOnce = async (src: string, name: string, phase: string) => {
    checkpoint();
    profiler.phase = phase;
    const s = await createBox(api, name, { fork: src });
    (forkSamples[phase] ??= []).push(s);
    profiler.phase = 'fork-delete';
    await deleteBox(api, name);
    return s.ms;
  };
  await forkOnce(BIG, 'fb-w', 'fork-warmup');
  await forkOnce(empty.name, 'fe-w', 'fork-warmup');
  const forkBig: number[] = [];
  const forkEmpty: number[] = [];
  for (let i = 1; i <= knobs.forks; i++) {
    forkBig.push(await forkOnce(BIG, `fb-${i}`, 'fork-big'));
    forkEmpty.push(await forkOnce(empty.name, `fe-${i}`, 'fork-empty'));
  }
  const fig = figure(`fork ${sizeLabel(knobs.bigMb)} box vs empty (${knobs.forks} each)`, forkBig, forkEmpty, 'fork of an empty box', TARGETS.fork);
  figures.push(fig);
  const steps = (phase: string) => stepsJson(profiler, phase, knobs.forks);
  results.fork = {
    big: summaryJson(summarize(forkBig)),
    empty: summaryJson(summarize(forkEmpty)),
    big_phases_ms: opPhases(logs, forkSamples['fork-big']),
    empty_phases_ms: opPhases(logs, forkSamples['fork-empty']),
    big_steps: steps('fork-big'),
    empty_steps: steps('fork-empty'),
  };
  progress(`fork done: big p50 ${fmtMs(fig.boxhost.p50)} ms, empty p50 ${fmtMs(fig.floor.p50)} ms`);
  return fig;
}

/** Snapshots of "big" (made by the fork figure) and of `empty`, each deleted after. */
export async function snapshotSection(ctx: SectionContext, empty: CreateSample): Promise<Figure> {
  const { api, knobs, profiler, figures, results, progress, checkpoint } = ctx;
  // POST …/snapshots answers once the job is done (201): pause, zfs snapshot, thaw.
  profiler.phase = 'snapshot';
  const snapOnce = async (box: string, name: string): Promise<number> => {
    const t0 = nowMs();
    const r = await api.call('POST', `/v1/projects/${PROJECT}/boxes/${box}/snapshots`, { name });
    const ms = nowMs() - t0;
    if (r.status !== 201) throw new Error(`snapshot of ${box}: ${r.status} ${r.text}`);
    const d = await api.call('DELETE', `/v1/projects/${PROJECT}/boxes/${box}/snapshots/${name}`);
    if (d.status !== 204) throw new Error(`snapshot delete of ${box}: ${d.status} ${d.text}`);
    return ms;
  };
  await snapOnce(BIG, 'sw');
  await snapOnce(empty.name, 'sw');
  const snapBig: number[] = [];
  const snapEmpty: number[] = [];
  for (let i = 0; i < knobs.forks; i++) {
    checkpoint();
    snapBig.push(await snapOnce(BIG, `s${i}`));
    snapEmpty.push(await snapOnce(empty.name, `s${i}`));
  }
  const fig = figure(`snapshot ${sizeLabel(knobs.bigMb)} box vs empty (${knobs.forks} each)`, snapBig, snapEmpty, 'snapshot of an empty box', TARGETS.fork);
  figures.push(fig);
  results.snapshot = { big: summaryJson(summarize(snapBig)), empty: summaryJson(summarize(snapEmpty)) };
  progress(`snapshot done: big p50 ${fmtMs(fig.boxhost.p50)} ms, empty p50 ${fmtMs(fig.floor.p50)} ms`);
  return fig;
}
