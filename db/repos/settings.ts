import type { Db } from '../knex';
import { now } from '../../core/ids';

/** A small key → JSON document store for host-wide settings. */
export const settingsRepo = {
  async get<T>(db: Db, key: string): Promise<T | null> {
    const row = await db('settings').where({ key }).first();
    return row ? (JSON.parse(row.value) as T) : null;
  },
  async put<T>(db: Db, key: string, value: T): Promise<void> {
    await db('settings')
      .insert({ key, value: JSON.stringify(value), updated_at: now() })
      .onConflict('key')
      .merge();
  },
};
