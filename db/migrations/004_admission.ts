import type { Knex } from 'knex';

/** What a node may promise (capacity × overcommit), and a project's own quotas. */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('nodes', (t) => {
    t.integer('alloc_cpus').nullable();
    t.integer('alloc_ram_mb').nullable();
    t.integer('alloc_disk_gb').nullable();
  });
  await db.schema.alterTable('projects', (t) => {
    // JSON of the quotas set for this project; absent keys (or null) take the defaults.
    t.text('quotas').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('projects', (t) => t.dropColumn('quotas'));
  await db.schema.alterTable('nodes', (t) => {
    t.dropColumn('alloc_cpus');
    t.dropColumn('alloc_ram_mb');
    t.dropColumn('alloc_disk_gb');
  });
}
