import type { Knex } from 'knex';

/**
 * Publishes (docs/services.md "Publishing"): a port of a box (or of one of its services) shown at
 * `<name>--<box>--<project>.<publish domain>` through the publish proxy. The host is unique (a
 * box name is unique in its project, a publish name in its box); a service has at most one.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('publishes', (t) => {
    t.string('host').primary();
    t.string('box_id').notNullable().index();
    t.string('project').notNullable();
    t.string('name').notNullable();
    t.integer('port').notNullable();
    t.boolean('public').notNullable();
    t.string('service').nullable();
    // Set when a non-public publish fell back to public (no auth provider configured).
    t.string('warning').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
    t.unique(['box_id', 'name']);
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.dropTable('publishes');
}
