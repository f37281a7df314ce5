import crypto from 'node:crypto';
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { Queue, Worker, type Job, type ConnectionOptions } from 'bullmq';
import type { RedisOptions } from 'ioredis';
import type { ApiContext } from './context';
import { settingsRepo } from '../db/repos/settings';
import { webhooksRepo, type WebhookRow } from '../db/repos/webhooks';
import { eventsNow, followEvents } from '../domain/events';
import { DISABLE_AFTER, policyOf } from '../domain/webhooks';
import { ADMIN_TOKEN_ID } from '../domain/tokens';
import { tokensRepo } from '../db/repos/tokens';
import IORedis from 'ioredis';
import type { AddressPolicy } from '../core/addressPolicy';
import { now } from '../core/ids';

/**
 * Webhook deliveries (docs/packs.md "Webhooks"), run by every api process:
 * - the dispatcher follows the events table (the stream's own reader, so holes of inserts still
 *   committing are waited for) from a cursor kept in `settings`, and for each event and each
 *   webhook that wants it adds a BullMQ job whose id is (webhook, event): two api processes
 *   dispatching the same event add one job;
 * - the deliverer takes those jobs (a queue apart from the nodes'), POSTs the event signed with
 *   the webhook's secret, and fails the attempt on anything but a 2xx, so BullMQ retries it
 *   with exponential backoff; a dead endpoint costs a job, never an api request.
 */

export const WEBHOOK_QUEUE = 'webhooks';
const CURSOR_KEY = 'webhooks.cursor';
const ATTEMPTS = 8;
const TIMEOUT_MS = 10_000;
const LOOKUP_TIMEOUT_MS = 5_000;
const CONCURRENCY = 16;
/** What is read of an answer (its status is what counts). */
const MAX_ANSWER_BYTES = 64 * 1024;

interface Delivery {
  webhookId: string;
  eventId: string;
  kind: string;
  event: unknown;
}

/** `Boxhost-Signature`: `v1=` HMAC-SHA256 of `<timestamp>.<body>` with the webhook's secret. */
export const signature = (secret: string, timestamp: string, body: string) =>
  `v1=${crypto.createHmac('sha256', secret).update(`${timestamp}.${body}`).digest('hex')}`;

/** A lookup that answers only addresses the policy allows; the connection goes to the one it
 *  answered (no second resolution a name could rebind in between). */
function guardedLookup(policy: AddressPolicy): net.LookupFunction {
  return (hostname, options, callback) => {
    // A resolver that does not answer holds a threadpool thread; the delivery does not wait on it.
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      (callback as (e: Error) => void)(Object.assign(new Error(`${hostname} did not resolve within ${LOOKUP_TIMEOUT_MS / 1000} s`), { code: 'ETIMEOUT' }));
    }, LOOKUP_TIMEOUT_MS);
    dns.lookup(hostname, { all: true, family: (options as dns.LookupOptions).family ?? 0 }, (err, addresses) => {
      clearTimeout(timer);
      if (settled) return;
      if (err) return (callback as (e: Error) => void)(err);
      const ok = addresses.filter((a) => policy.refusal(a.address) === null);
      if (ok.length === 0) {
        const why = policy.refusal(addresses[0]?.address ?? '') ?? `${hostname} has no address`;
        return (callback as (e: Error) => void)(Object.assign(new Error(`${hostname}: ${why}`), { code: 'EREFUSEDADDRESS' }));
      }
      if ((options as dns.LookupOptions).all) return (callback as (e: null, a: dns.LookupAddress[]) => void)(null, ok);
      (callback as (e: null, a: string, f: number) => void)(null, ok[0].address, ok[0].family);
    });
  };
}

/** One POST; answers its status. Refused addresses, timeouts and resets throw. */
export function post(url: URL, body: string, headers: Record<string, string>, policy: AddressPolicy): Promise<number> {
  const literal = url.hostname.replace(/^\[|\]$/g, '');
  if (net.isIP(literal)) {
    const why = policy.refusal(literal);
    if (why) return Promise.reject(new Error(why));
  }
  const lib = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = lib.request(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'user-agent': 'boxhost-webhooks/1', ...headers },
      lookup: guardedLookup(policy),
      timeout: TIMEOUT_MS,
      agent: false,
    }, (res) => {
      let read = 0;
      res.on('data', (c: Buffer) => {
        read += c.length;
        if (read > MAX_ANSWER_BYTES) res.destroy();
      });
      res.on('close', () => resolve(res.statusCode ?? 0));
      res.on('error', () => resolve(res.statusCode ?? 0));
    });
    const timer = setTimeout(() => req.destroy(new Error(`no answer within ${TIMEOUT_MS / 1000} s`)), TIMEOUT_MS);
    req.on('timeout', () => req.destroy(new Error(`no answer within ${TIMEOUT_MS / 1000} s`)));
    req.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    req.on('close', () => clearTimeout(timer));
    req.end(body);
  });
}

/** A webhook as the dispatcher matches events against it (its kinds read once per list). */
type Hook = WebhookRow & { kindSet: Set<string> | null };

const wants = (w: Hook, seq: number, kind: string, project: string) =>
  !w.disabled_at && seq > w.after_seq && (w.project === null || w.project === project) && (w.kindSet === null || w.kindSet.has(kind));

export interface Webhooks {
  close(): Promise<void>;
}

export async function startWebhooks(api: ApiContext, connection: RedisOptions, prefix: string): Promise<Webhooks> {
  const policy = policyOf(api.config);
  const log = api.log.child({ part: 'webhooks' });
  // Adds fail fast while Redis is down (the dispatcher retries from its cursor) rather than
  // queue for ever: a stop never waits on them.
  const client = new IORedis({ ...connection, enableOfflineQueue: false, maxRetriesPerRequest: 1 });
  client.on('error', () => undefined);
  const queue = new Queue<Delivery>(WEBHOOK_QUEUE, { connection: client, prefix });
  queue.on('error', () => undefined);

  const deliver = async (job: Job<Delivery>) => {
    const w = await webhooksRepo.get(api.db, job.data.webhookId);
    if (!w || w.disabled_at) return; // removed or disabled since
    // A webhook lives no longer than the token that made it (the bootstrap admin token has no row).
    if (w.token_id && w.token_id !== ADMIN_TOKEN_ID) {
      const token = await tokensRepo.byId(api.db, w.token_id);
      if (!token || (token.expires_at && Date.parse(token.expires_at) <= Date.now())) return;
    }
    const body = JSON.stringify({ id: job.data.eventId, kind: job.data.kind, event: job.data.event });
    const timestamp = String(Math.floor(Date.now() / 1000));
    const headers = {
      'boxhost-event-id': job.data.eventId,
      'boxhost-event-kind': job.data.kind,
      'boxhost-delivery': `${job.id}/${job.attemptsMade + 1}`,
      'boxhost-timestamp': timestamp,
      'boxhost-signature': signature(w.secret, timestamp, body),
    };
    let status: number | null = null;
    try {
      status = await post(new URL(w.url), body, headers, policy);
    } catch (e) {
      // What the resolver answered stays in the log: the record (project tokens read it) says only
      // what kind of failure it was.
      const code = (e as NodeJS.ErrnoException).code;
      const shown = code === 'EREFUSEDADDRESS' ? 'the URL resolves to an address webhooks are not sent to'
        : code === 'ETIMEOUT' || /within/.test((e as Error).message) ? 'no answer in time'
        : code ? `the connection failed (${code})` : 'the connection failed';
      log.info({ webhook: w.id, err: (e as Error).message }, 'a webhook delivery failed');
      await webhooksRepo.recordAttempt(api.db, w.id, { last_attempt_at: now(), last_status: null, last_error: shown });
      throw e;
    }
    const ok = status >= 200 && status < 300;
    await webhooksRepo.recordAttempt(api.db, w.id, { last_attempt_at: now(), last_status: status, last_error: ok ? null : `answered ${status}`, ...(ok ? { last_success_at: now() } : {}) });
    if (!ok) throw new Error(`answered ${status}`);
    await webhooksRepo.recordOutcome(api.db, w.id, true, DISABLE_AFTER, now());
  };
  const worker = new Worker<Delivery>(WEBHOOK_QUEUE, deliver, { connection: connection as ConnectionOptions, prefix, concurrency: CONCURRENCY });
  worker.on('error', (err) => log.warn({ err: err.message }, 'webhook worker connection error'));
  worker.on('failed', (job, err) => {
    if (!job || job.attemptsMade < ATTEMPTS) return;
    log.warn({ webhook: job.data.webhookId, event: job.data.eventId, err: err.message }, 'a webhook delivery failed for good');
    void webhooksRepo.recordOutcome(api.db, job.data.webhookId, false, DISABLE_AFTER, now()).catch(() => undefined);
  });

  // The dispatcher: from the cursor (first start: from now), each event to the webhooks that want it.
  const stop = new AbortController();
  const start = (await settingsRepo.get<number>(api.db, CURSOR_KEY)) ?? (await eventsNow(api));
  let hooks: { upTo: number; rows: Hook[] } = { upTo: -1, rows: [] };
  let saved = start;
  let cursor = start;
  // The cursor only moves forward (another api process may have saved a later one).
  let saving = false;
  const save = async () => {
    if (cursor <= saved || saving) return;
    saving = true;
    const at = cursor;
    try {
      const stored = (await settingsRepo.get<number>(api.db, CURSOR_KEY)) ?? 0;
      if (at > stored) await settingsRepo.put(api.db, CURSOR_KEY, at);
      saved = at;
    } catch {
      // saved next time
    } finally {
      saving = false;
    }
  };
  const saver = setInterval(() => void save(), 1000);
  const dispatching = (async () => {
    const everyone = { tokenId: 'webhooks', name: 'webhooks', projects: null };
    while (!stop.signal.aborted) {
      try {
        for await (const { seq, kind, event } of followEvents(api, everyone, {}, cursor, stop.signal)) {
          // The list read after position L holds every webhook that wants an event up to L (one
          // made later has a later after_seq): it is read again only for an event past it.
          if (seq > hooks.upTo) {
            const upTo = await eventsNow(api);
            hooks = { upTo, rows: (await webhooksRepo.list(api.db, null)).map((w) => ({ ...w, kindSet: w.kinds ? new Set(JSON.parse(w.kinds) as string[]) : null })) };
          }
          const project = (event as { project: string }).project;
          for (const w of hooks.rows.filter((h) => wants(h, seq, kind, project))) {
            await queue.add('deliver', { webhookId: w.id, eventId: (event as { id: string }).id, kind, event }, {
              jobId: `${w.id}.${seq}`,
              attempts: ATTEMPTS,
              backoff: { type: 'exponential', delay: api.config.webhooks.retryMs },
              removeOnComplete: { age: 24 * 3600, count: 10000 },
              removeOnFail: { age: 7 * 24 * 3600, count: 10000 },
            });
          }
          cursor = seq;
        }
      } catch (e) {
        // The db or Redis went away for a moment: the cursor did not move past what was queued.
        if (!stop.signal.aborted) log.warn({ err: (e as Error).message }, 'webhook dispatch failed; trying again');
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  })();

  return {
    close: async () => {
      stop.abort();
      clearInterval(saver);
      await dispatching;
      await save();
      await worker.close();
      await queue.close();
      client.disconnect();
    },
  };
}
