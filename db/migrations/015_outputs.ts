import type { Knex } from 'knex';

/**
 * Pack outputs (docs/packs.md "Outputs and env_from"). `env_links`: a box's `env_from` entries
 * in order, kept so its start renders them again: the source box's name, the variables the
 * link supplied last (`keys`) and those the box's own environment set at create (`own`, never
 * overwritten). `instance_secrets`: the values `{{secret.<name>}}` made for an instance.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('env_links', (t) => {
    t.string('box_id').notNullable();
    t.integer('position').notNullable();
    t.string('alias').notNullable();
    t.string('source').notNullable();
    t.text('keys').notNullable();
    t.text('own').notNullable();
    t.primary(['box_id', 'position']);
  });
  await db.schema.createTable('instance_secrets', (t) => {
    t.string('box_id').notNullable();
    t.string('name').notNullable();
    t.string('value').notNullable();
    t.string('created_at').notNullable();
    t.primary(['box_id', 'name']);
  });
}

export async function down(db: Knex): Promise<void> {
  for (const table of ['instance_secrets', 'env_links']) await db.schema.dropTableIfExists(table);
}
