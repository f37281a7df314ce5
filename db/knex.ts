import fs from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import knex, { Knex } from 'knex';
import type { Config } from '../core/config';
import { isBusy } from './errors';
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
    client: EmbeddedSqlite as unknown as typeof Knex.Client,
    connection: { filename: file },
    useNullAsDefault: true,
    pool: {
      min: 1,
      max: 1,
      // WAL lets the api read while a worker process writes. synchronous=NORMAL is WAL's own
      // recommendation: no fsync per commit, and a power cut can lose only the last commits,
      // never corrupt the file. busy_timeout is 0 once the connection is set up: a lock another
      // process holds is waited for by EmbeddedSqlite, off the event loop, not in sqlite.
      afterCreate: (conn: any, done: (err: Error | null, conn: any) => void) => {
        try {
          preparedOnce(conn);
          conn.exec(`PRAGMA busy_timeout = ${BUSY_WAIT_MS}; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 0;`);
          done(null, conn);
        } catch (e) {
          done(e as Error, conn);
        }
      },
    },
  });
}

/** How long a statement waits for a lock another process holds (sqlite's busy_timeout was this). */
const BUSY_WAIT_MS = 5000;
/** The waits between its tries, the last repeated. */
const BUSY_BACKOFF_MS = [1, 2, 4, 8, 16, 25];
/** How long queries that follow one another with nothing else awaited may hold the event loop. */
const TURN_MS = 20;


// knex's own better-sqlite3 dialect (no typings of its own: knex takes a client class).
const BetterSqlite3Client: new (config: Knex.Config) => { _query(connection: unknown, obj: unknown): Promise<unknown> } = require('knex/lib/dialects/better-sqlite3');

/**
 * knex's better-sqlite3 client, with two things a query on the calling thread needs:
 * - **A lock held by another process is waited for asynchronously.** With sqlite's busy_timeout
 *   the wait would spin on the event loop (the api's proxy, exec sessions, BullMQ's lock
 *   renewals all stalled behind it); here a statement that meets SQLITE_BUSY, which did nothing,
 *   is tried again after a short sleep, for up to BUSY_WAIT_MS in all.
 * - **The event loop turns.** Queries awaited one after another resolve in microtasks only (the
 *   pool's connection is free, the query runs at once), so a loop of thousands (a first prune of
 *   old operations) would hold the process until it ended: once queries have run for TURN_MS
 *   with no turn of the loop, the next waits for one.
 */
class EmbeddedSqlite extends BetterSqlite3Client {
  override async _query(connection: unknown, obj: unknown): Promise<unknown> {
    await loopTurn();
    const started = Date.now();
    for (let attempt = 0; ; attempt++) {
      try {
        return await super._query(connection, obj);
      } catch (e) {
        // Only a statement outside a transaction (a BEGIN IMMEDIATE, an autocommit write) waits:
        // inside one the write lock is held already, and a busy there would not pass by waiting.
        if (!isBusy(e) || (connection as { inTransaction?: boolean }).inTransaction || Date.now() - started >= BUSY_WAIT_MS) throw e;
        await sleep(BUSY_BACKOFF_MS[Math.min(attempt, BUSY_BACKOFF_MS.length - 1)]);
      }
    }
  }
}

let turnPending = false;
let turnAskedAt = 0;
/** Resolves at once unless queries have held the loop for TURN_MS since it last turned. */
async function loopTurn(): Promise<void> {
  if (turnPending) {
    if (performance.now() - turnAskedAt < TURN_MS) return;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  if (!turnPending) {
    turnPending = true;
    turnAskedAt = performance.now();
    setImmediate(() => {
      turnPending = false;
    });
  }
}

/** Runs pending migrations; safe to call from several processes at start. */
export async function migrate(db: Db): Promise<void> {
  await db.migrate.latest({ migrationSource: migrations, tableName: 'knex_migrations' });
}

/**
 * better-sqlite3 runs every statement through `prepare`, wrapped here for two things:
 * - **BEGIN IMMEDIATE.** knex opens sqlite transactions with a plain (deferred) `BEGIN`. A
 *   deferred transaction that has read, then writes after another process (a worker) committed,
 *   fails at once with SQLITE_BUSY: no waiting can help, the snapshot it read is stale. `BEGIN
 *   IMMEDIATE` takes the write lock first (EmbeddedSqlite waits for it up to BUSY_WAIT_MS), so
 *   the api and worker processes queue instead of failing (seen as 503 "the database is
 *   unavailable" on concurrent creates before).
 * - **Each SQL text is compiled once.** knex asks for a new statement at every query; sqlite's
 *   compile cost 8–40 µs of the ≈10 µs a row by key takes to run (measured here), ≈35 times per
 *   create on the event loop. The last PREPARED_KEPT texts keep their statement (a statement is
 *   used again only once its last use ended: knex's dialect runs each to the end with `all` or
 *   `run`, never as an iterator; sqlite compiles one again by itself after a schema change).
 *   knex sets `safeIntegers` on a statement only when a query asks for it, and no query here
 *   does (a kept statement would keep the setting for the later uses of its text). Memory:
 *   ≈9 KiB a simple statement, a few MiB in all.
 */
const PREPARED_KEPT = 500;
const ONCE_ONLY = /^\s*(SAVEPOINT|RELEASE|ROLLBACK\s+TO)\b/i;
const PLAIN_BEGIN = /^\s*BEGIN\s*(TRANSACTION)?\s*;?\s*$/i;
function preparedOnce(conn: any): void {
  const prepare = conn.prepare;
  const kept = new Map<string, unknown>();
  conn.prepare = function (sql: unknown, ...rest: unknown[]) {
    // Savepoints are named per transaction (`trx12`): their texts never come again.
    if (typeof sql !== 'string' || rest.length || ONCE_ONLY.test(sql)) return prepare.call(this, sql, ...rest);
    const hit = kept.get(sql);
    if (hit) {
      // Most recently used last: the oldest goes first when the map is full.
      kept.delete(sql);
      kept.set(sql, hit);
      return hit;
    }
    const statement = prepare.call(this, PLAIN_BEGIN.test(sql) ? 'BEGIN IMMEDIATE;' : sql);
    kept.set(sql, statement);
    if (kept.size > PREPARED_KEPT) kept.delete(kept.keys().next().value!);
    return statement;
  };
}
