import type { Knex } from 'knex';

/**
 * Datasets a node is to let go of (docs/data.md "Moving a volume to another node"): a volume
 * restored on another node leaves its old dataset behind on the node it left, which may be down
 * at that instant. The move records (volume, old node) here; that node destroys the dataset when
 * it next looks (at start and every few seconds), unless the volume is its own again or has an
 * operation under way, and then forgets the row.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('data_evictions', (t) => {
    t.string('volume_id').notNullable();
    t.string('node').notNullable().index();
    t.string('created_at').notNullable();
    t.primary(['volume_id', 'node']);
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.dropTableIfExists('data_evictions');
}
