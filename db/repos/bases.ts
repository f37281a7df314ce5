import type { Db } from '../knex';
import { now } from '../../core/ids';

export interface BaseRow {
  name: string;
  version: string;
  size_bytes: number;
  created_at: string;
}

export const basesRepo = {
  /** Records a base version once; a second call keeps the first record. */
  async ensure(db: Db, b: Omit<BaseRow, 'created_at'>): Promise<void> {
    await db<BaseRow>('bases').insert({ ...b, created_at: now() }).onConflict(['name', 'version']).ignore();
  },
  get: (db: Db, name: string, version: string) => db<BaseRow>('bases').where({ name, version }).first(),
  /** `<name>` means its newest version. */
  newest: (db: Db, name: string) => db<BaseRow>('bases').where({ name }).orderBy('created_at', 'desc').orderBy('version').first(),
  list: (db: Db) => db<BaseRow>('bases').orderBy('name').orderBy('created_at', 'desc'),
};
