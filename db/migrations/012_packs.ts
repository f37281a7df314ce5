import type { Knex } from 'knex';

/**
 * Packs and their events (docs/packs.md). A pack row holds the manifest as installed last
 * (`rev`: the manifest's content hash; `default_rev`: the label of its default revision). Each
 * revision's content is kept by its own content hash in `pack_revisions`, so an instance pinned to
 * one (`boxes.pack_rev`) keeps its verbs and base after the pack is installed again with other
 * content. `events` records each verb run (the spec's Event), newest first by `seq`.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('packs', (t) => {
    t.string('name').primary();
    t.text('description').nullable();
    t.string('rev').notNullable();
    t.string('default_rev').notNullable();
    t.text('manifest').notNullable();
    t.string('created_by').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
  await db.schema.createTable('pack_revisions', (t) => {
    t.string('pack').notNullable();
    t.string('rev').notNullable();
    t.text('content').notNullable();
    t.string('created_at').notNullable();
    t.primary(['pack', 'rev']);
  });
  await db.schema.createTable('events', (t) => {
    t.increments('seq').primary();
    t.string('id').notNullable().unique();
    t.string('ts').notNullable();
    t.string('kind').notNullable();
    t.string('project').notNullable().index();
    t.string('box_name').notNullable();
    t.string('box_id').nullable();
    t.string('pack').notNullable();
    t.string('rev').notNullable();
    t.string('verb').notNullable();
    t.text('args').notNullable();
    t.text('env_set').notNullable();
    t.string('who').notNullable();
    t.string('outcome').notNullable();
    t.integer('duration_ms').notNullable();
    t.text('error').nullable();
    t.integer('exit_code').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  for (const table of ['events', 'pack_revisions', 'packs']) await db.schema.dropTableIfExists(table);
}
