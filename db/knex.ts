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
    // better-sqlite3 runs a query on the calling thread: ≈0.03 ms for a row by key, where the
    // sqlite3 driver's hop through libuv's thread pool and back took 0.16 ms idle and 0.3–1.4 ms
    // beside a create's host work (≈35 queries a create; docs/decisions.md "The embedded
    // database"). No fs call stuck in a hung FUSE daemon can take the database's thread either.
    client: 'better-sqlite3',
    connection: { filename: file },
    useNullAsDefault: true,
    pool: {
      min: 1,
      max: 1,
      // WAL lets the api read while a worker process writes; busy_timeout rides out their
      // overlap. synchronous=NORMAL is WAL's own recommendation: no fsync per commit, and a
      // power cut can lose only the last commits, never corrupt the file.
      afterCreate: (conn: any, done: (err: Error | null, conn: any) => void) => {
        try {
          beginImmediate(conn);
          conn.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;');
          done(null, conn);
        } catch (e) {
          done(e as Error, conn);
        }
      },
    },
  });
}

/** Runs pending migrations; safe to call from several processes at start. */
export async function migrate(db: Db): Promise<void> {
  await db.migrate.latest({ migrationSource: migrations, tableName: 'knex_migrations' });
}


/**
 * knex opens sqlite transactions with a plain (deferred) `BEGIN`. A deferred transaction that
 * has read, then writes after another process (a worker) committed, fails at once with
 * SQLITE_BUSY: busy_timeout cannot help, the snapshot it read is stale. `BEGIN IMMEDIATE` takes
 * the write lock first, waiting up to busy_timeout for it, so the api and worker processes queue
 * instead of failing (seen as 503 "the database is unavailable" on concurrent creates before).
 */
function beginImmediate(conn: any): void {
  const prepare = conn.prepare;
  conn.prepare = function (sql: unknown, ...rest: unknown[]) {
    const text = typeof sql === 'string' && /^\s*BEGIN\s*(TRANSACTION)?\s*;?\s*$/i.test(sql) ? 'BEGIN IMMEDIATE;' : sql;
    return prepare.call(this, text, ...rest);
  };
}
