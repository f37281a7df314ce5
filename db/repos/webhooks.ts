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
  remove: (db: Db, id: string) => db<WebhookRow>('webhooks').where({ id }).delete(),
  recordAttempt: (db: Db, id: string, patch: Pick<WebhookRow, 'last_attempt_at' | 'last_status' | 'last_error'> & { last_success_at?: string }) =>
    db<WebhookRow>('webhooks').where({ id }).update(patch),
};
