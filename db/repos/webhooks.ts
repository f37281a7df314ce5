import type { Db } from '../knex';

/** A webhook as stored (db/migrations/014_webhooks.ts); `kinds` is a JSON array or null (all). */
export interface WebhookRow {
  id: string;
  url: string;
  project: string | null;
  kinds: string | null;
  secret: string;
  after_seq: number;
  created_by: string | null;
  token_id: string | null;
  failures: number;
  disabled_at: string | null;
  created_at: string;
  last_attempt_at: string | null;
  last_success_at: string | null;
  last_status: number | null;
  last_error: string | null;
}

export const webhooksRepo = {
  get: (db: Db, id: string) => db<WebhookRow>('webhooks').where({ id }).first(),
  /** Every webhook, or those of `projects` (host-wide ones are no project's). */
  list: (db: Db, projects: string[] | null) => {
    const q = db<WebhookRow>('webhooks').orderBy('created_at').orderBy('id');
    return projects === null ? q : q.whereIn('project', projects);
  },
  count: async (db: Db, project: string | null) =>
    Number((await db('webhooks').where(project === null ? { project: null } : { project }).count({ n: '*' }).first())?.n ?? 0),
  insert: (db: Db, row: WebhookRow) => db<WebhookRow>('webhooks').insert(row),
  /**
   * Inserts `row` unless its project (or the host, for a host-wide one) already has `max`:
   * false then. Counted and inserted in one transaction that concurrent registrations take in
   * turn (SQLite's transactions begin IMMEDIATE; on PostgreSQL the table is locked against other
   * writers for it), so two at once cannot both pass the count.
   */
  insertCapped: (db: Db, row: WebhookRow, max: number) =>
    db.transaction(async (trx) => {
      if (db.client.config.client === 'pg') await trx.raw('LOCK TABLE webhooks IN SHARE ROW EXCLUSIVE MODE');
      if ((await webhooksRepo.count(trx, row.project)) >= max) return false;
      await trx<WebhookRow>('webhooks').insert(row);
      return true;
    }),
  remove: (db: Db, id: string) => db<WebhookRow>('webhooks').where({ id }).delete(),
  recordAttempt: (db: Db, id: string, patch: Pick<WebhookRow, 'last_attempt_at' | 'last_status' | 'last_error'> & { last_success_at?: string }) =>
    db<WebhookRow>('webhooks').where({ id }).update(patch),
  /** A delivery that succeeded (true) or failed for good: the run of failures, and past
   *  `limit` the webhook is disabled. */
  async recordOutcome(db: Db, id: string, ok: boolean, limit: number, at: string): Promise<void> {
    if (ok) await db<WebhookRow>('webhooks').where({ id }).update({ failures: 0 });
    else {
      await db<WebhookRow>('webhooks').where({ id }).increment('failures', 1);
      await db<WebhookRow>('webhooks').where({ id }).whereNull('disabled_at').where('failures', '>=', limit).update({ disabled_at: at });
    }
  },
};
