import type { Knex } from 'knex';

/**
 * Base builds (docs/bases.md "Builds"): a script run in a temporary box from a parent base,
 * saved as `base@version`. `project` is where the temporary box runs (and whose tokens see the
 * build); `owner` the project the base belongs to (null: every project's). `script_started` and
 * `script_done` let a retried job know what it already did. The log is kept in chunks, in order,
 * so the api can stream it while the build runs, from whichever node runs it.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('base_builds', (t) => {
    t.string('id').primary();
    t.string('status').notNullable();
    t.string('base').notNullable();
    t.string('version').notNullable();
    t.string('parent').notNullable();
    t.text('script').notNullable();
    t.boolean('cached').notNullable();
    t.boolean('force').notNullable();
    t.string('project').notNullable().index();
    t.string('owner').nullable();
    t.string('box_id').nullable();
    t.string('box').nullable();
    t.boolean('script_started').notNullable().defaultTo(false);
    t.boolean('script_done').notNullable().defaultTo(false);
    // This build reserved base@version (it did not exist), or destroyed the old one (force):
    // what its failure may take back.
    t.boolean('reserved').notNullable().defaultTo(false);
    t.boolean('replaced').notNullable().defaultTo(false);
    t.integer('exit_code').nullable();
    t.text('error').nullable();
    t.bigInteger('log_bytes').notNullable().defaultTo(0);
    t.string('created_by').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
  await db.schema.createTable('base_build_logs', (t) => {
    t.increments('seq').primary();
    t.string('build_id').notNullable().index();
    t.text('text').notNullable();
  });
}

export async function down(db: Knex): Promise<void> {
  for (const table of ['base_build_logs', 'base_builds']) await db.schema.dropTableIfExists(table);
}
