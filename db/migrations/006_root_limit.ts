import type { Knex } from 'knex';

/** How many box roots a node's storage can hold mounted in all (null: no limit of its own),
 *  reported with every heartbeat; admission counts a node's boxes against it. */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('nodes', (t) => {
    t.integer('alloc_boxes').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('nodes', (t) => {
    t.dropColumn('alloc_boxes');
  });
}
