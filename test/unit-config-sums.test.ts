/**
 * Admission's sums (db/json.ts boxConfigSums: the database sums the boxes' config JSON) give the
 * same figures on sqlite and on PostgreSQL as adding the rows up by hand: per node
 * (`nodesRepo.committed`) and per project (`projectsRepo.usage`, with its data volumes).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t, { Test } from 'tap';
import { createDb, migrate, Db } from '../db/knex';
import { nodesRepo } from '../db/repos/nodes';
import { projectsRepo } from '../db/repos/projects';
import { makePgSchema } from './helpers/db';

const box = (i: number, project: string, node: string, config: Record<string, number | string>) => ({
  id: `b${i}`, project, name: `box${i}`, status: 'running', config: JSON.stringify(config), node, created_at: 'x', updated_at: 'x',
});

async function check(t: Test, db: Db): Promise<void> {
  await migrate(db);
  t.same(await nodesRepo.committed(db), new Map(), 'no boxes: nothing committed');
  t.same(await projectsRepo.usage(db, 'p1'), { boxes: 0, cpus: 0, ram_mb: 0, storage_gb: 0, volumes: 0 }, 'no boxes: no usage');
  await db('boxes').insert([
    box(1, 'p1', 'n1', { cpus: 2, ram_mb: 1024, storage_gb: 10, region: 'r' }),
    box(2, 'p1', 'n2', { cpus: 1, ram_mb: 512, storage_gb: 5 }),
    box(3, 'p2', 'n1', { cpus: 4, ram_mb: 4096, storage_gb: 100 }),
    box(4, 'p1', 'n1', { cpus: 64, ram_mb: 1048576, storage_gb: 10240 }),
  ]);
  await db('data_volumes').insert({ id: 'v1', name: 'vol1', project: 'p1', node: 'n1', quota_gb: 7, state: 'ready', created_at: 'x', updated_at: 'x' });
  const committed = await nodesRepo.committed(db);
  t.same(committed.get('n1'), { cpus: 70, ram_mb: 1024 + 4096 + 1048576, disk_gb: 10 + 100 + 10240 + 7, boxes: 3 }, 'node n1: its boxes and its volume');
  t.same(committed.get('n2'), { cpus: 1, ram_mb: 512, disk_gb: 5, boxes: 1 }, 'node n2');
  t.same(await projectsRepo.usage(db, 'p1'), { boxes: 3, cpus: 67, ram_mb: 1024 + 512 + 1048576, storage_gb: 10 + 5 + 10240 + 7, volumes: 1 }, 'project p1: its boxes and its volume');
  t.same(await projectsRepo.usage(db, 'p2'), { boxes: 1, cpus: 4, ram_mb: 4096, storage_gb: 100, volumes: 0 }, 'project p2');
  t.ok(Object.values(await projectsRepo.usage(db, 'p1')).every((v) => typeof v === 'number'), 'numbers, not strings');

  // Saved and imported bases count by their bytes in whole GB rounded up, per project and per
  // node; a built-in base (on every node, nobody's) counts nowhere.
  const GiB = 1024 ** 3;
  const base = (name: string, project: string | null, node: string | null, size: number, origin = 'saved') => ({ name, version: 'v1', size_bytes: size, created_at: 'x', state: 'ready', origin, project, node });
  await db('bases').insert([
    base('s1', 'p1', 'n1', 100 * 1024 ** 2),
    base('s2', 'p1', 'n2', GiB + 1),
    base('i1', null, 'n1', 3 * GiB, 'imported'),
    base('busybox', null, null, 5 * GiB, 'builtin'),
  ]);
  const withBases = await nodesRepo.committed(db);
  t.equal(withBases.get('n1')!.disk_gb, 10 + 100 + 10240 + 7 + Math.ceil((100 * 1024 ** 2 + 3 * GiB) / GiB), "node n1 adds its bases' 3.1 GB as 4");
  t.equal(withBases.get('n2')!.disk_gb, 5 + 2, 'node n2 adds 1 GB and a byte as 2');
  t.equal((await projectsRepo.usage(db, 'p1')).storage_gb, 10 + 5 + 10240 + 7 + 2, "project p1 adds its two bases' 1.1 GB as 2 (rounded once, not per base)");
  t.equal((await projectsRepo.usage(db, 'p2')).storage_gb, 100, 'project p2 has no base');
}

t.test('sqlite', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-sums-'));
  const db = createDb({ dataDir: dir, databaseUrl: undefined });
  t.teardown(async () => {
    await db.destroy();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  await check(t, db);
});

t.test('PostgreSQL', async (t) => {
  const schema = await makePgSchema();
  const db = createDb({ dataDir: '/nonexistent', databaseUrl: schema.url });
  t.teardown(async () => {
    await db.destroy();
    await schema.drop();
  });
  await check(t, db);
});
