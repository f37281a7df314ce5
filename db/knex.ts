import fs from 'node:fs';
import path from 'node:path';
import knex, { Knex } from 'knex';
import type { Config } from '../core/config';
import { migrations } from './migrations';

export type Db = Knex;

/** knex on the embedded sqlite file, or on Postgres when DATABASE_URL says so. */
export function createDb(config: Pick<Config, 'dataDir' | 'databaseUrl'>): Db {
  const url = config.databaseUrl;
  if (url && /^postgres(ql)?:/.test(url)) {
    return knex({ client: 'pg', connection: url, pool: { min: 0, max: 10 } });
  }
  const file = url ? url.replace(/^(sqlite|file):(\/\/)?/, '') : path.join(config.dataDir, 'boxhost.sqlite');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  return knex({
    client: 'sqlite3',
    connection: { filename: file },
    useNullAsDefault: true,
    pool: {
      min: 1,
      max: 1,
      // WAL lets the api read while a worker process writes; busy_timeout rides out their
      // overlap. synchronous=NORMAL is WAL's own recommendation: no fsync per commit, and a
      // power cut can lose only the last commits, never corrupt the file.
      afterCreate: (conn: any, done: (err: Error | null, conn: any) => void) => {
        conn.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;', (err: Error | null) => done(err, conn));
      },
    },
  });
}

/** Runs pending migrations; safe to call from several processes at start. */
export async function migrate(db: Db): Promise<void> {
  await db.migrate.latest({ migrationSource: migrations, tableName: 'knex_migrations' });
}

