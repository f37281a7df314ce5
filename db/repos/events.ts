import type { Knex } from 'knex';
import type { Db } from '../knex';
import type { PackEvent } from '../../core/apiTypes';

/**
 * Events (db/migrations/012_packs.ts): a pack verb's run (`kind: verb`, the spec's Event) or a
 * box's lifecycle transition (`kind: box.created`, `box.stopped`, …; pack, rev and verb empty).
 * `seq` orders them: the list pages back from the newest, a stream follows forward.
 */
export interface EventRow {
  seq?: number;
  id: string;
  ts: string;
  kind: string;
  project: string;
  box_name: string;
  box_id: string | null;
  pack: string;
  rev: string;
  verb: string;
  args: string;
  env_set: string;
  who: string;
  outcome: PackEvent['outcome'];
  duration_ms: number;
  error: string | null;
  exit_code: number | null;
}

export interface EventFilter {
  /** Only these kinds (`verb`, `box.created`, …); absent: all. */
  kinds?: string[];
  projects: string[] | null;
  project?: string;
  box?: string;
  pack?: string;
  verb?: string;
  outcome?: string;
  since?: string;
  /** Only events older than this one (the page before). */
  beforeSeq?: number;
  limit: number;
}

function filtered<Q extends Knex.QueryBuilder>(q: Q, f: Omit<EventFilter, 'limit' | 'beforeSeq'>): Q {
  if (f.kinds) q.whereIn('kind', f.kinds);
  if (f.projects) q.whereIn('project', f.projects);
  if (f.project) q.where({ project: f.project });
  if (f.box) q.where({ box_name: f.box });
  if (f.pack) q.where({ pack: f.pack });
  if (f.verb) q.where({ verb: f.verb });
  if (f.outcome) q.where('outcome', f.outcome);
  if (f.since) q.where('ts', '>=', f.since);
  return q;
}

/** The events kept: older ones are dropped (every run and transition adds one, for ever). */
export const EVENTS_KEPT = 100_000;
/** Inserts by this process between two prunes. */
const PRUNE_EVERY = 256;
let sincePrune = 0;

export const eventsRepo = {
  async insert(db: Db, row: EventRow): Promise<void> {
    await db<EventRow>('events').insert(row);
    if (++sincePrune >= PRUNE_EVERY) {
      sincePrune = 0;
      await eventsRepo.prune(db, EVENTS_KEPT);
    }
  },
  /** Keeps the newest `keep` events. */
  async prune(db: Db, keep: number): Promise<number> {
    const newest = await eventsRepo.lastSeq(db);
    return db('events').where('seq', '<=', newest - keep).delete();
  },
  /** Oldest first after position `afterSeq` (what a stream sends next). */
  after: (db: Db, f: Omit<EventFilter, 'limit' | 'beforeSeq'>, afterSeq: number, limit: number) =>
    filtered(db<EventRow>('events').where('seq', '>', afterSeq).orderBy('seq', 'asc').limit(limit), f) as Promise<EventRow[]>,
  /** The newest position (0 with no event). */
  lastSeq: async (db: Db) => Number((await db('events').max({ m: 'seq' }).first())?.m ?? 0),
  byId: (db: Db, id: string) => db<EventRow>('events').where({ id }).first(),
  /** Newest first; `beforeSeq` pages back. One more than `limit` tells whether a page follows. */
  page(db: Db, f: EventFilter) {
    const q = filtered(db<EventRow>('events').orderBy('seq', 'desc').limit(f.limit + 1), f);
    if (f.beforeSeq !== undefined) q.where('seq', '<', f.beforeSeq);
    return q as Promise<EventRow[]>;
  },
};
