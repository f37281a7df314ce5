import type { Knex } from 'knex';

/** What a node's storage watchdog did: how many times it restarted the storage, and when last. */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('nodes', (t) => {
    t.integer('storage_restarts').notNullable().defaultTo(0);
    t.string('storage_restarted_at').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('nodes', (t) => {
    t.dropColumn('storage_restarts');
    t.dropColumn('storage_restarted_at');
  });
}
