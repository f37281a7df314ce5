import type { Knex } from 'knex';

export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('tokens', (t) => {
    t.string('id').primary();
    t.string('name').notNullable();
    t.string('secret_hash').notNullable().unique();
    t.text('projects').nullable(); // JSON array, null = every project
    t.string('created_at').notNullable();
    t.string('expires_at').nullable();
    t.string('last_used_at').nullable();
  });
  await db.schema.createTable('settings', (t) => {
    t.string('key').primary();
    t.text('value').notNullable(); // JSON
    t.string('updated_at').notNullable();
  });
  await db.schema.createTable('grants', (t) => {
    t.string('name').primary();
    t.text('permissions').notNullable();
    t.text('repositories').notNullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
  await db.schema.createTable('operations', (t) => {
    // seq is the arrival order: operations on one box run in it.
    t.increments('seq').primary();
    t.string('id').notNullable().unique();
    t.string('kind').notNullable();
    t.string('status').notNullable();
    t.string('resource').notNullable();
    t.string('box_id').nullable().index();
    t.integer('progress').nullable();
    t.text('error').nullable();
    t.text('payload').notNullable();
    t.string('created_by').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
}

export async function down(db: Knex): Promise<void> {
  for (const table of ['operations', 'grants', 'settings', 'tokens']) await db.schema.dropTableIfExists(table);
}
