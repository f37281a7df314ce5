import type { Knex } from 'knex';

/**
 * Data volumes (docs/data.md). A volume is a dataset on one node (`node`), owned by one project
 * once it has one (`project`: the creator's, or the first box it is attached to; null until
 * then, seen only by tokens without a project limit). `state` is `creating` while its create
 * job runs. Attachments are also written into the box row's `data_mounts` (what the box shows);
 * this table is the volume's side of them (and remembers, until the box stops, a volume
 * detached from a box that still has it mounted). Backups are `zfs send` streams in the backup
 * directory; their rows keep what the spec shows plus the stream's size and sha256.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('data_volumes', (t) => {
    t.string('id').primary();
    t.string('name').notNullable().unique();
    t.string('project').nullable().index();
    t.string('node').notNullable().index();
    t.string('state').notNullable();
    t.integer('quota_gb').notNullable();
    t.text('description').nullable();
    t.bigInteger('size_bytes').notNullable().defaultTo(0);
    t.string('created_by').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
  await db.schema.createTable('data_attachments', (t) => {
    t.string('volume_id').notNullable().index();
    t.string('box_id').notNullable().index();
    t.string('project').notNullable();
    t.string('box').notNullable();
    t.string('path').notNullable();
    t.boolean('read_only').notNullable();
    // Detached from a box that still runs with it mounted: kept (not shown) until the box's
    // next stop or start, so the volume is not deleted or restored under it.
    t.boolean('detached').notNullable().defaultTo(false);
    t.string('created_at').notNullable();
    t.unique(['volume_id', 'box_id']);
  });
  await db.schema.createTable('data_backups', (t) => {
    t.string('id').primary();
    t.string('volume_id').notNullable().index();
    t.string('name').notNullable();
    t.string('status').notNullable();
    t.string('mode').nullable();
    t.string('parent').nullable();
    t.text('description').nullable();
    t.text('error').nullable();
    t.string('sha256').nullable();
    t.bigInteger('size_bytes').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
    t.unique(['volume_id', 'name']);
  });
}

export async function down(db: Knex): Promise<void> {
  for (const table of ['data_backups', 'data_attachments', 'data_volumes']) await db.schema.dropTableIfExists(table);
}
