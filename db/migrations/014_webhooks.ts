import type { Knex } from 'knex';

/**
 * Webhooks (docs/packs.md "Webhooks"): a URL that gets each event of a project (or of every
 * project: `project` null), signed with its `secret` (kept as is: it signs, it is not checked).
 * `after_seq` is the last event position before it was registered (it gets only later ones);
 * `last_*` say how its latest delivery went.
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
