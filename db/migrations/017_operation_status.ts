import type { Knex } from 'knex';

/**
 * An index on `operations(status, updated_at)`: the unfinished operations of a node (reconcile,
 * a node declared dead), `GET /v1/operations?status=…`, and the hourly drop of finished ones
 * past BOXHOST_OPERATIONS_KEEP_DAYS read by it instead of scanning every operation ever run.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('operations', (t) => {
    t.index(['status', 'updated_at'], 'operations_status_updated_at');
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('operations', (t) => {
    t.dropIndex(['status', 'updated_at'], 'operations_status_updated_at');
  });
}
