/**
 * The events table's bound (db/repos/events.ts): only the newest EVENTS_KEPT are kept, pruned
 * every few hundred inserts of a process; here the prune itself on a real sqlite file.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { createDb, migrate } from '../db/knex';
import { eventsRepo, EVENTS_KEPT } from '../db/repos/events';
import { newId, now } from '../core/ids';

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-events-'));
const db = createDb({ dataDir, databaseUrl: undefined });
t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const event = (i: number) => ({
  id: newId('ev'), ts: now(), kind: 'verb', project: 'p', box_name: `b${i}`, box_id: null, pack: 'k', rev: 'r', verb: 'v', args: '[]', env_set: '[]',
  who: 'admin', outcome: 'success' as const, duration_ms: 1, error: null, exit_code: 0,
});

t.test('prune keeps the newest, in order, and is a bound people can rely on', async (t) => {
  t.ok(EVENTS_KEPT >= 10_000, `a bound that still keeps a useful history (${EVENTS_KEPT})`);
  for (let i = 0; i < 10; i++) await eventsRepo.insert(db, event(i));
  t.equal(await eventsRepo.prune(db, 3), 7, 'the 7 oldest go');
  const left = await eventsRepo.page(db, { projects: null, limit: 100 });
  t.same(left.map((e) => e.box_name), ['b9', 'b8', 'b7'], 'the 3 newest stay, newest first');
  t.equal(await eventsRepo.prune(db, 3), 0, 'nothing more to drop');
});

t.test('an insert prunes by itself every few hundred', async (t) => {
  const before = Number((await db('events').count({ n: '*' }).first())?.n);
  for (let i = 0; i < 300; i++) await eventsRepo.insert(db, event(100 + i));
  t.equal(Number((await db('events').count({ n: '*' }).first())?.n), before + 300, 'under the bound nothing goes');
});
