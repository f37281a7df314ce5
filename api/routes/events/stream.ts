import Joi from 'joi';
import { createSession } from 'better-sse';
import { defineRoute } from '../../http/route';
import { eventFilters } from './schemas';
import { eventsNow, followEvents, StreamFilter, streamKinds } from '../../../domain/events';
import { BoxhostError, invalid } from '../../../core/errors';
import { assertProject } from '../../../domain/access';

/** `Last-Event-ID`: the position of the last event the client has (the `id:` of each event sent). */
function lastEventId(header: string | string[] | undefined): number | undefined {
  if (header === undefined || header === '') return undefined;
  const v = Array.isArray(header) ? header[0] : header;
  if (!/^\d{1,15}$/.test(v)) throw invalid('Last-Event-ID is not an id this stream sent', [{ field: 'Last-Event-ID', issue: 'must be the id of an event of this stream' }]);
  return Number(v);
}

export default defineRoute<unknown, StreamFilter>({
  method: 'get',
  path: '/v1/events/stream',
  summary: 'The events of GET /v1/events and box lifecycle events (box.created, box.stopped, …) pushed as Server-Sent Events (event name: the kind; id: its position); Last-Event-ID resumes after that event without loss',
  tag: 'events',
  query: Joi.object({
    ...eventFilters,
    kinds: Joi.string().max(512).description('comma-separated: verb, box (every box kind), or box.created, box.stopped, box.resumed, box.deleted, box.restored, box.failed, box.published, box.deployed; all by default'),
  }),
  responses: {
    200: { description: 'text/event-stream: each event as `event: <kind>`, `id: <position>`, `data: <JSON>` (an Event for verb, a BoxEvent for box kinds); a comment every 15 s keeps it open' },
    400: { description: 'a bad filter or Last-Event-ID' },
    429: { description: 'the token holds its most streams open on this api process (8; see Retry-After)' },
    404: { description: 'a project the token may not see' },
  },
  handler: async ({ req, res, api, identity, query }) => {
    // The client may be gone already (it left while the request was authenticated): the stream
    // ends on the response's close, whoever notices it first.
    const open = openStreams.get(identity.tokenId) ?? 0;
    if (open >= STREAMS_PER_TOKEN) {
      throw new BoxhostError('rate_limited', `this token has ${open} event streams open on this api process, the most it may; close one first`, [], { 'Retry-After': '5' });
    }
    openStreams.set(identity.tokenId, open + 1);
    const gone = new AbortController();
    const end = () => gone.abort();
    res.once('close', end);
    const lifetime = setTimeout(end, api.config.eventStreamMaxSecs * 1000);
    try {
      // Everything that can be refused is, before the stream starts (an error body, not an event).
      const after = lastEventId(req.headers['last-event-id']);
      if (query.project) assertProject(identity, query.project, `project ${query.project}`);
      streamKinds(query.kinds);
      if (res.destroyed) return;
      const session = await createSession(req, res, { keepAlive: 15_000, retry: 2000, trustClientEventId: false });
      session.once('disconnected', end);
      if (res.destroyed) return;
      // A stream from now says where now is (an `id:` field alone, no event), so a client that
      // reconnects before any event came resumes from there and misses nothing between.
      const from = after ?? (await eventsNow(api));
      if (after === undefined) await session.batch((b) => void b.id(String(from)).dispatch());
      // It ends after BOXHOST_EVENT_STREAM_MAX_SECS whatever happens (the client reconnects with
      // Last-Event-ID; a token revoked meanwhile is refused then).
      for await (const { seq, kind, event } of followEvents(api, identity, query, from, gone.signal)) {
        if (gone.signal.aborted || res.destroyed) break;
        session.push(event, kind, String(seq));
        // A client that reads slowly slows the stream (it resumes with Last-Event-ID if it drops).
        if (res.writableNeedDrain) await drained(res, gone.signal);
      }
    } catch (e) {
      if (res.headersSent) {
        if (!gone.signal.aborted) api.log.warn({ err: (e as Error).message }, 'an event stream ended on an error');
      } else throw e;
    } finally {
      const left = (openStreams.get(identity.tokenId) ?? 1) - 1;
      if (left > 0) openStreams.set(identity.tokenId, left);
      else openStreams.delete(identity.tokenId);
      clearTimeout(lifetime);
      res.off('close', end);
      gone.abort();
      if (res.headersSent && !res.writableEnded) res.end();
    }
  },
});

/** Streams one token may hold open on one api process (each polls the db twice a second). */
export const STREAMS_PER_TOKEN = 8;
const openStreams = new Map<string, number>();


function drained(res: NodeJS.WritableStream & { once: NodeJS.EventEmitter['once']; off: NodeJS.EventEmitter['off'] }, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    res.once('drain', done);
    signal.addEventListener('abort', done, { once: true });
  });
}
