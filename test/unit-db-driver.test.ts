/**
 * The embedded database's driver (db/knex.ts EmbeddedSqlite, docs/decisions.md "The embedded
 * database"): a write lock another connection holds is waited for without holding the event
 * loop, and queries awaited one after another let the loop turn.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { createDb, migrate } from '../db/knex';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-db-driver-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = path.join(dir, 'boxhost.sqlite');
// Two connections to one file, as an api process and a node process have.
const a = createDb({ dataDir: dir, databaseUrl: `sqlite:${file}` });
const b = createDb({ dataDir: dir, databaseUrl: `sqlite:${file}` });
t.teardown(async () => {
  await a.destroy();
  await b.destroy();
});

/** Holds the write lock on `a` (a transaction that has written project `name`) until released;
 *  resolves once the lock is held. `done`: the transaction's end. */
async function holdWriteLock(name: string, netIndex: number): Promise<{ release: () => void; done: Promise<void> }> {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => (locked = resolve));
  const done = a.transaction(async (trx) => {
    await trx('projects').insert({ name, created_at: 'x', net_index: netIndex });
    locked();
    await held;
  });
  await Promise.race([isLocked, done]);
  return { release, done };
}

t.test('a lock another connection holds is waited for, with the event loop free', async (t) => {
  await migrate(a);
  await b.raw('select 1');
  const { release, done: holder } = await holdWriteLock('p-a', 1);
  // The loop's turns while b waits for the lock (a loop blocked in sqlite's busy wait has none).
  let ticks = 0;
  const ticker = setInterval(() => ticks++, 5);
  const t0 = Date.now();
  // Started now (a knex query runs only once it is awaited or then'd).
  const write = b('projects').insert({ name: 'p-b', created_at: 'x', net_index: 2 }).then(() => Date.now());
  let releasedAt = 0;
  let wroteAt = 0;
  try {
    releasedAt = await new Promise<number>((resolve) =>
      setTimeout(() => {
        release();
        resolve(Date.now());
      }, 150),
    );
    wroteAt = await write;
  } finally {
    // A failing write must not leave a's transaction open (the teardown would wait on it).
    release();
    clearInterval(ticker);
    await holder;
  }
  t.ok(wroteAt >= releasedAt, "b's write ended only after a's transaction did");
  t.ok(ticks >= 5, `the event loop kept turning while b waited ${Date.now() - t0} ms (${ticks} ticks of 5 ms)`);
  t.same((await b('projects').whereIn('name', ['p-a', 'p-b']).orderBy('name').pluck('name')), ['p-a', 'p-b'], 'both writes are there');
});

t.test('a lock held past the wait fails with SQLITE_BUSY', async (t) => {
  const { release, done: holder } = await holdWriteLock('p-c', 3);
  const t0 = Date.now();
  const err = await b('projects')
    .insert({ name: 'p-d', created_at: 'x', net_index: 4 })
    .then(() => null, (e: { code?: string }) => e)
    .finally(release);
  await holder;
  t.match(err, { code: /^SQLITE_BUSY/ }, 'the write failed busy');
  t.ok(Date.now() - t0 >= 4900, `after the 5 s wait (${Date.now() - t0} ms)`);
  t.equal(await b('projects').where({ name: 'p-d' }).first(), undefined, 'and wrote nothing');
});

t.test('queries awaited one after another let the loop turn', async (t) => {
  let turned = 0;
  const timer = setInterval(() => turned++, 1);
  const t0 = Date.now();
  let n = 0;
  // Only queries awaited here: with a driver whose queries resolve at once, nothing else would
  // run until the loop ended.
  while (Date.now() - t0 < 300) {
    await b('projects').where({ name: 'p-a' }).first();
    n++;
  }
  clearInterval(timer);
  t.ok(n > 100, `${n} queries in 300 ms`);
  t.ok(turned >= 5, `a 1 ms timer fired ${turned} times meanwhile`);
});

t.test('a statement is compiled once per SQL text, and still answers after the schema changes', async (t) => {
  await migrate(a);
  await a.schema.createTable('stmt_cache_probe', (tb) => tb.string('k'));
  const conn = await (a.client as any).acquireConnection();
  // What the driver's prepare hands knex, query by query.
  const driverPrepare = conn.prepare;
  const handed: unknown[] = [];
  conn.prepare = function (sql: string) {
    const st = driverPrepare.call(this, sql);
    handed.push(st);
    return st;
  };
  await a.client.releaseConnection(conn);
  try {
    await a('stmt_cache_probe').insert({ k: 'one' });
    handed.length = 0;
    for (let i = 0; i < 5; i++) t.same(await a('stmt_cache_probe').select('*').orderBy('k'), [{ k: 'one' }], `read ${i + 1}`);
    t.equal(handed.length, 5, 'five queries, five statements asked for');
    t.equal(new Set(handed).size, 1, 'one statement, compiled once, for the five');
    await a('stmt_cache_probe').where({ k: 'two' }).first();
    t.not(handed[5], handed[0], 'another text, another statement');
    await a.schema.alterTable('stmt_cache_probe', (tb) => tb.string('extra').defaultTo('x'));
    t.same(await a('stmt_cache_probe').select('*').orderBy('k'), [{ k: 'one', extra: 'x' }], 'the kept statement sees the new column');
    t.equal(handed.at(-1), handed[0], 'and it is the same statement');
  } finally {
    conn.prepare = driverPrepare;
    await a.schema.dropTableIfExists('stmt_cache_probe');
  }
});
