import type { Db } from '../knex';
import { now } from '../../core/ids';

/** A pack as stored (db/migrations/012_packs.ts); `manifest` is the installed manifest's JSON. */
export interface PackRow {
  name: string;
  description: string | null;
  rev: string;
  default_rev: string;
  manifest: string;
  created_by: string | null;
  created_at: string;
  updated_at: string;
}

export const packsRepo = {
  get: (db: Db, name: string) => db<PackRow>('packs').where({ name }).first(),
  /** The row locked until the transaction ends (an instance create and a delete take it in turn). */
  lock: (db: Db, name: string) => db<PackRow>('packs').where({ name }).forUpdate().first(),
  list: (db: Db) => db<PackRow>('packs').orderBy('name'),
  /** Installs or replaces the manifest and keeps each revision's content by its hash. */
  async put(db: Db, row: PackRow, revisions: { rev: string; content: string }[]): Promise<void> {
    await db.transaction(async (trx) => {
      const at = now();
      for (const r of revisions) {
        await trx('pack_revisions').insert({ pack: row.name, rev: r.rev, content: r.content, created_at: at }).onConflict(['pack', 'rev']).ignore();
      }
      const had = await trx<PackRow>('packs').where({ name: row.name }).forUpdate().first();
      if (had) await trx<PackRow>('packs').where({ name: row.name }).update({ description: row.description, rev: row.rev, default_rev: row.default_rev, manifest: row.manifest, updated_at: at });
      else await trx<PackRow>('packs').insert(row);
    });
  },
  revision: (db: Db, pack: string, rev: string) => db<{ pack: string; rev: string; content: string }>('pack_revisions').where({ pack, rev }).first(),
  async remove(db: Db, name: string): Promise<void> {
    await db('pack_revisions').where({ pack: name }).delete();
    await db('packs').where({ name }).delete();
  },
  instances: async (db: Db, name: string) => Number((await db('boxes').where({ pack: name }).count({ n: '*' }).first())?.n ?? 0),
};

