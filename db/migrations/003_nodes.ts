import type { Knex } from 'knex';

/** Nodes (the machines that hold boxes) and the two columns operations gain with them. */
export async function up(db: Knex): Promise<void> {
  await db.schema.createTable('nodes', (t) => {
    t.string('id').primary();
    t.string('name').notNullable();
    t.string('region').notNullable();
    // Where the api reaches the node agent; null: only in its own process.
    t.string('agent_url').nullable();
    // active: takes new boxes; draining: keeps its boxes, takes no new ones.
    t.string('state').notNullable().defaultTo('active');
    t.integer('cpus').notNullable();
    t.integer('ram_mb').notNullable();
    t.integer('disk_gb').notNullable();
    t.string('version').notNullable();
    t.string('started_at').notNullable();
    // The node's own clock, written every heartbeat; null once it stopped cleanly.
    t.string('heartbeat_at').nullable();
    // "ok" or why the node's storage failed its last check.
    t.text('storage').notNullable().defaultTo('ok');
    t.string('created_at').notNullable();
    t.string('updated_at').notNullable();
  });
  await db.schema.alterTable('operations', (t) => {
    // Who may read an operation is this column, not a pattern on its resource path.
    t.string('project').nullable().index();
    // The node whose queue holds the job (null: none, a host-wide operation).
    t.string('node').nullable();
  });
  const rows = await db('operations').select('id', 'resource');
  for (const r of rows) {
    const m = /^\/v1\/projects\/([^/]+)\//.exec(r.resource);
    if (m) await db('operations').where({ id: r.id }).update({ project: m[1] });
  }
  await db('operations').whereNotNull('box_id').update({ node: db('boxes').select('node').where('boxes.id', db.ref('operations.box_id')) });
  await db.schema.alterTable('boxes', (t) => t.index(['node']));
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('boxes', (t) => t.dropIndex(['node']));
  await db.schema.alterTable('operations', (t) => {
    t.dropColumn('project');
    t.dropColumn('node');
  });
  await db.schema.dropTableIfExists('nodes');
}
