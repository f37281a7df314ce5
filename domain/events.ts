import type { DomainContext, Identity } from './context';
import { decodeSeqCursor, encodeSeqCursor } from './seqCursor';
import type { BoxEvent, EventList, PackEvent } from '../core/apiTypes';
import { invalidField } from '../core/errors';
import { eventsRepo, type EventRow } from '../db/repos/events';
import { BOX_EVENT_KINDS } from '../core/apiTypes';
import { assertProject } from './access';
import { DEFAULT_PAGE } from './paging';

/** The query of `GET /v1/events` (DESIGN.md §4); pages like boxes (§6). */
export interface ListEventsQuery {
  project?: string;
  box?: string;
  pack?: string;
  verb?: string;
  outcome?: PackEvent['outcome'];
  since?: string;
  max_results?: number;
  continuation_token?: string;
}

/** A box lifecycle event as the stream sends it. */
export function toBoxEvent(r: EventRow): BoxEvent {
  return {
    id: r.id, ts: r.ts, kind: r.kind as BoxEvent['kind'], project: r.project, box_name: r.box_name, who: r.who, outcome: r.outcome === 'error' ? 'error' : 'success', duration_ms: r.duration_ms,
    ...(r.pack ? { pack: r.pack, rev: r.rev } : {}), ...(r.error !== null ? { error: r.error } : {}),
  };
}

export function toEvent(r: EventRow): PackEvent {
  return {
    id: r.id, ts: r.ts, pack: r.pack, rev: r.rev, verb: r.verb, args: JSON.parse(r.args) as string[], env_set: JSON.parse(r.env_set) as string[],
    box_name: r.box_name, project: r.project, who: r.who, outcome: r.outcome, duration_ms: r.duration_ms,
    ...(r.error !== null ? { error: r.error } : {}), ...(r.exit_code !== null ? { exit_code: r.exit_code } : {}),
  };
}

/**
 * Events newest first. A project-limited token sees its projects' events only (another
 * project named → 404, as for boxes). The continuation token is the last event's position, so
 * pages stay stable while new events arrive.
 */
export async function listEvents(ctx: DomainContext, identity: Identity, q: ListEventsQuery): Promise<EventList> {
  if (q.project) assertProject(identity, q.project, `project ${q.project}`);
  const limit = q.max_results || DEFAULT_PAGE;
  const rows = await eventsRepo.page(ctx.db, {
    kinds: ['verb'],
    projects: identity.projects, project: q.project, box: q.box, pack: q.pack, verb: q.verb, outcome: q.outcome, since: q.since,
    beforeSeq: q.continuation_token ? decodeSeqCursor(q.continuation_token) : undefined, limit,
  });
  const page = rows.slice(0, limit);
  const hasMore = rows.length > limit;
  return { events: page.map(toEvent), has_more: hasMore, next_continuation_token: hasMore ? encodeSeqCursor(page[page.length - 1].seq!) : null };
}

/** How often a stream looks for new events (any api process may have recorded them). */
const STREAM_POLL_MS = 500;
const STREAM_BATCH = 500;
/** A hole in the positions is waited for this long: on PostgreSQL an insert that took its
 *  number earlier can commit after a later one (a hole that stays is a rolled-back insert). */
const GAP_WAIT_MS = 5000;

export type StreamFilter = Omit<ListEventsQuery, 'max_results' | 'continuation_token' | 'since'> & {
  /** Comma-separated kinds (`verb`, `box.created`, …, or `box` for every box kind); all by default. */
  kinds?: string;
};

/** `kinds=verb,box` → the kinds they name. */
export function streamKinds(spec: string | undefined): string[] | undefined {
  if (!spec) return undefined;
  const out = new Set<string>();
  for (const k of spec.split(',').map((x) => x.trim()).filter(Boolean)) {
    if (k === 'box') BOX_EVENT_KINDS.forEach((b) => out.add(b));
    else if (k === 'verb' || (BOX_EVENT_KINDS as string[]).includes(k)) out.add(k);
    else throw invalidField('kinds', `${k} is not an event kind (verb, box, ${BOX_EVENT_KINDS.join(', ')})`);
  }
  return [...out];
}

/** The position of the newest event: where a stream from now begins. */
export const eventsNow = (ctx: Pick<DomainContext, 'db'>) => eventsRepo.lastSeq(ctx.db);

/** Whether a row is one the stream's token and filters want. */
function matcher(identity: Identity, f: StreamFilter): (r: EventRow) => boolean {
  const kinds = streamKinds(f.kinds);
  return (r) => (!kinds || kinds.includes(r.kind)) && (identity.projects === null || identity.projects.includes(r.project)) && (!f.project || r.project === f.project)
    && (!f.box || r.box_name === f.box) && (!f.pack || r.pack === f.pack) && (!f.verb || r.verb === f.verb) && (!f.outcome || r.outcome === f.outcome);
}

/**
 * The events after position `after` (oldest first), then each new one as it is recorded, until
 * `signal` aborts: what `GET /v1/events/stream` sends. Positions are the events' sequence
 * numbers, the stream's event ids, so a client that reconnects with `Last-Event-ID` misses
 * nothing: the positions are read unfiltered and the stream never moves past a hole younger
 * than GAP_WAIT_MS (an insert still committing). `eventsNow` is where a stream from now begins.
 */
export async function* followEvents(ctx: DomainContext, identity: Identity, f: StreamFilter, after: number, signal: AbortSignal): AsyncGenerator<{ seq: number; kind: string; event: PackEvent | BoxEvent }> {
  if (f.project) assertProject(identity, f.project, `project ${f.project}`);
  const wanted = matcher(identity, f);
  let seq = after;
  let gapSince: number | undefined;
  while (!signal.aborted) {
    const rows = await eventsRepo.after(ctx.db, { projects: null }, seq, STREAM_BATCH);
    let full = rows.length === STREAM_BATCH;
    for (const r of rows) {
      if (r.seq! !== seq + 1) {
        gapSince ??= Date.now();
        if (Date.now() - gapSince < GAP_WAIT_MS) {
          full = false;
          break;
        }
      }
      gapSince = undefined;
      seq = r.seq!;
      if (wanted(r)) yield { seq, kind: r.kind, event: r.kind === 'verb' ? toEvent(r) : toBoxEvent(r) };
      if (signal.aborted) return;
    }
    if (full) continue;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, STREAM_POLL_MS);
      function done() {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        resolve();
      }
      signal.addEventListener('abort', done, { once: true });
    });
  }
}
