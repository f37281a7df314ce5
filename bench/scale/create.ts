/**
 * The creates: N boxes through the HTTP API as a user makes them (POST …/boxes?wait=300, then the
 * operation wait if that runs out), BATCH per batch, CREATE_CONCURRENCY in flight; then per
 * hundred the p50/p95, where a create's time goes (the worker's job vs the api around it, from
 * the host's log) and the host steps whose time per create grew most from the first hundred to
 * the last.
 */
import os from 'node:os';
import type { Api } from '../api';
import type { Profiler } from '../profile';
import { summaryJson } from '../report';
import { fmtMs, nowMs, round1, summarize } from '../stats';
import { mapLimit, sleep, stepsOf, waitOp } from './common';
import type { ScaleHostLog } from './hostLog';
import { BATCH, CREATE_CONCURRENCY, SCALE_TARGET, SMALL, STOP_FAILED_SHARE } from './shape';

export interface Created {
  i: number;
  project: string;
  name: string;
  ms: number;
  /** 503s (no node can take a box now: its storage is being restarted) before the create went in. */
  unavailable: number;
  sentAt: number;
  answeredAt: number;
  opId: string | null;
  boxId?: string;
  error?: string;
}

/** One batch: its boxes, how long it took, and when (for the storage watchdog's events). */
export interface Hundred {
  from: number;
  to: number;
  wallMs: number;
  samples: Created[];
  startedAt: number;
  endedAt: number;
}

/** How long a create keeps asking again while the api answers 503 (the node's storage is down). */
const UNAVAILABLE_RETRY_MS = 300_000;

/**
 * POST …/boxes?wait=300 until the box runs (request → running). A 503 (no node can take a box
 * now, e.g. while the node's storage watchdog restarts zfs-fuse) is asked again a second later
 * (or after its Retry-After), as a client would; the time counts from the first request.
 */
async function createBox(api: Api, i: number, project: string, name: string): Promise<Created> {
  const sentAt = Date.now();
  const t0 = nowMs();
  let unavailable = 0;
  let res = await api.call('POST', `/v1/projects/${project}/boxes?wait=300`, { name, config: SMALL });
  while (res.status === 503 && nowMs() - t0 < UNAVAILABLE_RETRY_MS) {
    unavailable++;
    await sleep(Math.max(1, Number(res.headers.get('retry-after')) || 1) * 1000);
    res = await api.call('POST', `/v1/projects/${project}/boxes?wait=300`, { name, config: SMALL });
  }
  const opId = res.headers.get('operation-id');
  let box = res.body;
  let error: string | undefined;
  if (res.status === 202 && opId) {
    const op = await waitOp(api, opId);
    const got = await api.call('GET', `/v1/projects/${project}/boxes/${name}`);
    box = got.body;
    if (op.status !== 'succeeded') error = `operation ${op.status}: ${op.error ?? ''}`;
  } else if (res.status !== 200) {
    error = `answered ${res.status}: ${res.text.slice(0, 300)}`;
  }
  const ms = nowMs() - t0;
  if (!error && box?.status !== 'running') error = `status ${box?.status ?? '?'}: ${box?.error ?? ''}`;
  return { i, project, name, ms, unavailable, sentAt, answeredAt: Date.now(), opId, boxId: box?.id, error };
}

/**
 * Creates boxes 0…N−1 in batches (profiler phase `scale-create-<batch>`), stopping early once a
 * batch mostly fails. Throws when no create ended running.
 */
export async function createInBatches(opts: {
  api: Api;
  N: number;
  projectOf: (i: number) => string;
  nameOf: (i: number) => string;
  profiler: Profiler;
  progress: (msg: string) => void;
  checkpoint: () => void;
  /** Run after the first batch, before the second (the raw floor's first measure). */
  afterFirstBatch?: (boxes: number) => Promise<void>;
}): Promise<{ hundreds: Hundred[]; created: Created[]; stoppedEarly: string | null }> {
  const { api, N, projectOf, nameOf, profiler, progress, checkpoint } = opts;
  const created: Created[] = [];
  const hundreds: Hundred[] = [];
  let stoppedEarly: string | null = null;
  for (let from = 0; from < N; from += BATCH) {
    checkpoint();
    const to = Math.min(N, from + BATCH);
    const h = hundreds.length;
    profiler.phase = `scale-create-${h}`;
    const samples: Created[] = [];
    const w0 = nowMs();
    const startedAtH = Date.now();
    await mapLimit(
      Array.from({ length: to - from }, (_, k) => from + k),
      CREATE_CONCURRENCY,
      async (i) => {
        const c = await createBox(api, i, projectOf(i), nameOf(i));
        samples.push(c);
        if (c.error) progress(`scale: create ${c.project}/${c.name} did not end running: ${c.error}`);
      },
    );
    hundreds.push({ from, to, wallMs: nowMs() - w0, samples, startedAt: startedAtH, endedAt: Date.now() });
    created.push(...samples);
    const s = summarize(samples.map((c) => c.ms));
    progress(`scale: boxes ${from}–${to}: create p50 ${fmtMs(s.p50)} ms, p95 ${fmtMs(s.p95)} ms, ${((to - from) / ((nowMs() - w0) / 1000)).toFixed(1)} boxes/s, load ${os.loadavg()[0].toFixed(1)}`);
    if (from === 0 && opts.afterFirstBatch) await opts.afterFirstBatch(to);
    const failed = samples.filter((c) => c.error).length;
    if (failed > samples.length * STOP_FAILED_SHARE) {
      stoppedEarly = `${failed} of the ${samples.length} creates of boxes ${from}–${to} did not end running: no more are made`;
      progress(`scale: ${stoppedEarly}`);
      break;
    }
  }
  if (!created.some((c) => !c.error)) throw new Error(`no create ended running: ${created[0]?.error ?? 'none made'}`);
  return { hundreds, created, stoppedEarly };
}

/** The create figures per hundred, for results.json (`create`) and the report. */
export function createFigures(hundreds: Hundred[], ok: Created[], hostLog: ScaleHostLog, profiler: Profiler) {
  const { opLog, storageEvents } = hostLog;
  const phaseOf = (c: Created) => {
    const o = c.opId ? opLog.get(c.opId) : undefined;
    return o?.running && o.succeeded ? { toJob: o.running - c.sentAt, job: o.succeeded - o.running, afterJob: c.answeredAt - o.succeeded, retries: o.retries } : null;
  };
  const perHundred = hundreds.map((hd, h) => {
    const good = hd.samples.filter((c) => !c.error);
    const ph = good.map(phaseOf).filter((p): p is NonNullable<typeof p> => p !== null);
    return {
      range: `${hd.from}–${hd.to}`,
      create: summarize(good.map((c) => c.ms)),
      to_job: summarize(ph.map((p) => p.toJob)),
      job: summarize(ph.map((p) => p.job)),
      after_job: summarize(ph.map((p) => p.afterJob)),
      retries: ph.reduce((a, p) => a + p.retries, 0),
      failures: hd.samples.length - good.length,
      asked_again_after_503: hd.samples.filter((c) => c.unavailable > 0).length,
      storage_restarts: storageEvents.filter((ev) => ev.time >= hd.startedAt && ev.time <= hd.endedAt && ev.msg === 'killed the zfs-fuse daemon').length,
      boxes_per_s: hd.samples.length / (hd.wallMs / 1000),
      steps: stepsOf(profiler, `scale-create-${h}`, hd.samples.length),
    };
  });
  const first = perHundred[0];
  const last = perHundred[perHundred.length - 1];
  const ratio = last.create.p50 / first.create.p50;
  const json: Record<string, any> = {
    per_hundred: perHundred.map((p) => ({
      range: p.range,
      create: summaryJson(p.create),
      request_to_job_running: summaryJson(p.to_job),
      job_running_to_succeeded: summaryJson(p.job),
      job_succeeded_to_answer: summaryJson(p.after_job),
      job_retries: p.retries,
      failures: p.failures,
      asked_again_after_503: p.asked_again_after_503,
      storage_restarts: p.storage_restarts,
      boxes_per_s: round1(p.boxes_per_s),
    })),
    last_over_first_p50: Math.round(ratio * 100) / 100,
    target: SCALE_TARGET,
    result: ratio <= SCALE_TARGET ? 'PASS' : 'MISS',
    all: summaryJson(summarize(ok.map((c) => c.ms))),
    wall_s: round1(hundreds.reduce((a, hd) => a + hd.wallMs, 0) / 1000),
  };
  // The host steps whose time per create grew the most from the first hundred to the last.
  const firstSteps = new Map(first.steps.map((s) => [s.label, s]));
  const lastSteps = new Map(last.steps.map((s) => [s.label, s]));
  const growth = [...new Set([...firstSteps.keys(), ...lastSteps.keys()])]
    .map((label) => {
      const a = firstSteps.get(label);
      const b = lastSteps.get(label);
      return { label, first_ms_per_op: round1(a?.msPerOp ?? 0), last_ms_per_op: round1(b?.msPerOp ?? 0), first_p50: round1(a?.p50 ?? NaN), last_p50: round1(b?.p50 ?? NaN), calls_per_op_last: round1(b?.callsPerOp ?? 0) };
    })
    .sort((x, y) => y.last_ms_per_op - y.first_ms_per_op - (x.last_ms_per_op - x.first_ms_per_op));
  json.step_growth = growth;
  json.steps_per_hundred = perHundred.map((p) => ({ range: p.range, steps: p.steps.slice(0, 16).map((s) => ({ label: s.label, calls_per_op: round1(s.callsPerOp), p50: round1(s.p50), ms_per_op: round1(s.msPerOp) })) }));
  return { perHundred, first, last, ratio, growth, json };
}

export type CreateFigures = ReturnType<typeof createFigures>;
