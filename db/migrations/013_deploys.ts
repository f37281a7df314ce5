import type { Knex } from 'knex';

/**
 * Deploy generations (docs/packs.md "Deploy generations"). A line is an instance and the boxes
 * deployed after it, named by the instance (`line`): the publishes of the line keep its host names
 * whichever generation serves them. `live_box_id` is the generation that holds them; `deploy_op`
 * the deploy or rollback under way (null when none), `switched_at` when the publishes last moved
 * and `switched_by` the operation that moved them.
 * `deploy_generations` names each box of a line with its number (the instance is 1). Tokens get
 * `scopes` (JSON array, null for none): `deploy` lets a project token deploy and roll back.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('deploy_lines', (t) => {
    t.string('project').notNullable();
    t.string('line').notNullable();
    t.string('live_box_id').notNullable();
    t.integer('generation').notNullable();
    t.string('deploy_op').nullable();
    t.string('switched_at').nullable();
    t.string('switched_by').nullable();
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
    t.primary(['project', 'line']);
  });
  await db.schema.createTable('deploy_generations', (t) => {
    t.string('box_id').primary();
    t.string('project').notNullable();
    t.string('line').notNullable();
    t.integer('generation').notNullable();
    t.index(['project', 'line']);
  });
  await db.schema.alterTable('tokens', (t) => {
    t.text('scopes').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('tokens', (t) => {
    t.dropColumn('scopes');
  });
  for (const table of ['deploy_generations', 'deploy_lines']) await db.schema.dropTableIfExists(table);
}
