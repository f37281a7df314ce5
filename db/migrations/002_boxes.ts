import type { Knex } from 'knex';

export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('projects', (t) => {
    t.string('name').primary();
    // The project's /24 inside BOXHOST_BOX_SUBNET: its own bridge.
    t.integer('net_index').notNullable().unique();
    t.string('created_at').notNullable();
  });
  await db.schema.createTable('bases', (t) => {
    t.string('name').notNullable();
    t.string('version').notNullable();
    t.bigInteger('size_bytes').notNullable().defaultTo(0);
    t.string('created_at').notNullable();
    t.primary(['name', 'version']);
  });
  await db.schema.createTable('boxes', (t) => {
    t.string('id').primary();
    t.string('project').notNullable();
    t.string('name').notNullable();
    t.string('status').notNullable();
    t.text('error').nullable();
    t.string('base').nullable();
    t.string('fork').nullable();
    t.text('config').notNullable();
    t.text('environment').nullable();
    t.text('tags').nullable();
    t.text('data_mounts').nullable();
    t.string('lifecycle').nullable();
    t.string('pack').nullable();
    t.string('pack_rev').nullable();
    t.string('rollback_to').nullable();
    t.integer('termination_grace_period_seconds').nullable();
    t.text('url_settings').nullable();
    t.string('node').notNullable();
    t.string('address').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
    t.unique(['project', 'name']);
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.dropTableIfExists('boxes');
  await db.schema.dropTableIfExists('bases');
  await db.schema.dropTableIfExists('projects');
}
