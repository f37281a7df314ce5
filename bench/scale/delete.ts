/**
 * Deleting the boxes, DELETE_CONCURRENCY at a time (issue 13's figure): p50/p95 and where the
 * time goes; and, after an error, deleting whatever is left the same way before the host closes.
 */
import type { Api, CallResult } from '../api';
import type { Profiler } from '../profile';
import { summaryJson } from '../report';
import { fmtMs, nowMs, round1, summarize } from '../stats';
import { mapLimit, stepsOf, waitOp } from './common';
import { walkList } from './list';
import { DELETE_CONCURRENCY } from './shape';

/** Deletes `boxes` (profiler phase `scale-delete`, set by the caller): the latencies and the
 *  figures for results.json (`delete`); a failed delete or a box left listed goes to `problems`. */
export async function deleteAll(opts: {
  api: Api;
  boxes: { project: string; name: string }[];
  profiler: Profiler;
  problems: string[];
  progress: (msg: string) => void;
}): Promise<{ deletes: number[]; json: Record<string, any> }> {
  const { api, boxes: toDelete, profiler, problems, progress } = opts;
  progress(`scale: deleting ${toDelete.length} boxes, ${DELETE_CONCURRENCY} at a time`);
  const deletes: number[] = [];
  const d0 = nowMs();
  let deleted = 0;
  await mapLimit(toDelete, DELETE_CONCURRENCY, async (b) => {
    const t0 = nowMs();
    const res = await api.call('DELETE', `/v1/projects/${b.project}/boxes/${b.name}?wait=300`);
    let ok = res.status === 204 || res.status === 404;
    if (res.status === 202) {
      const opId = res.headers.get('operation-id');
      if (opId) ok = (await waitOp(api, opId)).status === 'succeeded';
    }
    if (!ok) problems.push(`delete ${b.project}/${b.name} answered ${res.status}: ${res.text.slice(0, 200)}`);
    else deletes.push(nowMs() - t0);
    if (++deleted % 100 === 0) progress(`scale: ${deleted} deleted, p50 so far ${fmtMs(summarize(deletes).p50)} ms`);
  });
  const deleteWall = nowMs() - d0;
  const rest = await walkList(api, '-');
  if (rest.boxes.length) problems.push(`${rest.boxes.length} boxes still listed after the deletes`);
  const json = { deleted: deletes.length, latency: summaryJson(summarize(deletes)), wall_s: round1(deleteWall / 1000), left_listed: rest.boxes.length, steps: stepsOf(profiler, 'scale-delete', Math.max(1, deletes.length)).slice(0, 12).map((s) => ({ label: s.label, calls_per_op: round1(s.callsPerOp), p50: round1(s.p50), ms_per_op: round1(s.msPerOp) })) };
  progress(`scale: deletes done: p50 ${fmtMs(json.latency.p50)} ms in ${json.wall_s} s`);
  return { deletes, json };
}

/** After an error: every box still listed, deleted through the API (the normal path deleted
 *  them all already). Throws if they cannot be listed. */
export async function deleteLeft(api: Api, problems: string[], progress: (msg: string) => void): Promise<void> {
  const left = (await walkList(api, '-')).boxes;
  progress(`scale teardown: deleting ${left.length} boxes through the API`);
  await mapLimit(left, DELETE_CONCURRENCY, async (b) => {
    const r = await api.call('DELETE', `/v1/projects/${b.project}/boxes/${b.name}?wait=300`).catch((err) => ({ status: 0, text: String(err) }) as CallResult);
    if (![204, 404].includes(r.status)) problems.push(`delete ${b.project}/${b.name} answered ${r.status}: ${r.text.slice(0, 200)}`);
  });
}
