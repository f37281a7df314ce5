import type { Knex } from 'knex';

/**
 * Webhooks (docs/packs.md "Webhooks"): a URL that gets each event of a project (or of every
 * project: `project` null), signed with its `secret` (kept as is: it signs, it is not checked).
 * `after_seq` is the last event position before it was registered (it gets only later ones);
 * `last_*` say how its latest delivery went; `failures` counts deliveries failed in a row, and
 * `disabled_at` is set when they pass the limit (a dead receiver stops costing deliveries).
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('webhooks', (t) => {
    t.string('id').primary();
    t.text('url').notNullable();
    t.string('project').nullable().index();
    t.text('kinds').nullable();
    t.string('secret').notNullable();
    t.integer('after_seq').notNullable();
    t.string('created_by').nullable();
    // The token that made it: a revoked or expired one's webhooks get nothing more.
    t.string('token_id').nullable();
    // Deliveries failed in a row (a success resets it); past the limit the webhook is disabled.
    t.integer('failures').notNullable().defaultTo(0);
    t.string('disabled_at').nullable();
    t.string('created_at').notNullable();
    t.string('last_attempt_at').nullable();
    t.string('last_success_at').nullable();
    t.integer('last_status').nullable();
    t.text('last_error').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.dropTableIfExists('webhooks');
}
