import type { Knex } from 'knex';

/**
 * Bases beyond the built-in ones (docs/bases.md): saved from a box or imported. A version is
 * `making` while its job runs (so its name@version is taken and no box is made from it) and
 * `ready` after. `project` is the owner of a saved base (only tokens that reach it see it);
 * null for built-in and imported bases, which every project may use. `node` is the node whose
 * pool holds it; null for built-in bases, which every node makes for itself.
 */
export async function up(db: Knex): Promise<void> {
  await db.schema.alterTable('bases', (t) => {
    t.string('state').notNullable().defaultTo('ready');
    t.string('origin').notNullable().defaultTo('builtin');
    t.string('project').nullable();
    t.string('node').nullable();
    t.string('builder').nullable();
    t.string('parent').nullable();
    t.string('parent_alias').nullable();
    t.string('parent_version').nullable();
    t.text('script').nullable();
    t.string('script_sha256').nullable();
    t.string('sha256').nullable();
    t.string('created_by').nullable();
  });
}

export async function down(db: Knex): Promise<void> {
  await db.schema.alterTable('bases', (t) => {
    for (const c of ['state', 'origin', 'project', 'node', 'builder', 'parent', 'parent_alias', 'parent_version', 'script', 'script_sha256', 'sha256', 'created_by']) t.dropColumn(c);
  });
}
