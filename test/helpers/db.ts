import knex from 'knex';
import { randomId } from '../../core/ids';

/** The PostgreSQL the tests use (a database `test` on 127.0.0.1, trust auth, unless told). */
export const PG = process.env.BOXHOST_TEST_PG ?? 'postgres://root@127.0.0.1:5432/test';

/** Which database `startTestHost` gives a host: `BOXHOST_TEST_DB=postgres` → a fresh
 *  PostgreSQL schema per host; anything else → the sqlite file in the host's data dir. */
export const testDbKind = (): 'postgres' | 'sqlite' => (process.env.BOXHOST_TEST_DB === 'postgres' ? 'postgres' : 'sqlite');

export interface PgSchema {
  schema: string;
  /** A DATABASE_URL whose connections use only this schema. */
  url: string;
  drop(): Promise<void>;
}

/** A schema of its own in the shared PostgreSQL, for one host or cluster; `drop` removes it. */
export async function makePgSchema(): Promise<PgSchema> {
  const schema = `bh_test_${randomId(8)}`;
  const admin = knex({ client: 'pg', connection: PG, pool: { min: 0, max: 1 } });
  await admin.raw(`create schema ${schema}`);
  return {
    schema,
    url: `${PG}?options=${encodeURIComponent(`-c search_path=${schema}`)}`,
    async drop() {
      try {
        await admin.raw(`drop schema if exists ${schema} cascade`);
      } finally {
        await admin.destroy();
      }
    },
  };
}
