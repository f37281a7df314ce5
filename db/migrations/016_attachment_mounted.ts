import type { Knex } from 'knex';

/**
 * `data_attachments.mounted`: whether a start of the box has bound the volume in since it was
 * attached (docs/data.md "Attach and detach"). A detach from a running box whose container
 * never mounted the volume (attached after its start) lets go of it at once instead of
 * holding it until the box stops. Rows from before are taken as mounted (the safe side).
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('data_attachments', (t) => {
    t.boolean('mounted').notNullable().defaultTo(true);
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('data_attachments', (t) => {
    t.dropColumn('mounted');
  });
}
