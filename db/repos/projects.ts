import type { Db } from '../knex';
import { now } from '../../core/ids';
import { isUniqueViolation } from '../errors';
import { basesGb, boxConfigSums, configSumsOf } from '../json';
import { basesRepo } from './bases';

export interface ProjectRow {
  name: string;
  net_index: number;
  created_at: string;
  /** JSON of the quotas set for the project (absent keys: the defaults). */
  quotas: string | null;
}

/**
 * No network index is left for a new project: each project owns one block of the box subnet
 * for good (its index), and the layout holds `max` (core/netblocks.ts). The domain says what to
 * change; this layer does not read the config.
 */
export class NoFreeNetIndex extends Error {
  constructor(readonly max: number) {
    super(`all ${max} project network indexes are taken`);
  }
}

export const projectsRepo = {
  /** `lock`: FOR UPDATE inside a transaction (Postgres), so concurrent creates in one project
   *  check its quotas one after the other. */
  get: (db: Db, name: string, opts: { lock?: boolean } = {}) => {
    const q = db<ProjectRow>('projects').where({ name }).first();
    return opts.lock ? q.forUpdate() : q;
  },
  setQuotas: (db: Db, name: string, quotas: Record<string, number>) => db<ProjectRow>('projects').where({ name }).update({ quotas: JSON.stringify(quotas) }),
  /** What the project's boxes and data volumes hold (a volume's quota counts as storage), summed
   *  by the database. */
  async usage(db: Db, name: string): Promise<{ boxes: number; cpus: number; ram_mb: number; storage_gb: number; volumes: number }> {
    // Asked at once (one round trip's wait instead of three; a transaction's connection takes them in turn).
    const [vols, boxes, basesBytes] = await Promise.all([
      db('data_volumes').where({ project: name }).first(db.raw('count(*) as n'), db.raw('coalesce(sum(quota_gb), 0) as gb')) as Promise<{ n: number | string; gb: number | string } | undefined>,
      db('boxes').where({ project: name }).first(boxConfigSums(db)),
      basesRepo.bytesOwned(db, name),
    ]);
    const sums = configSumsOf(boxes);
    return { ...sums, storage_gb: sums.storage_gb + Number(vols?.gb ?? 0) + basesGb(basesBytes), volumes: Number(vols?.n ?? 0) };
  },
  list: (db: Db) => db<ProjectRow>('projects').orderBy('name'),
  /** Projects come into being with their first box; this finds (`lock`: as `get`) or makes one
   *  (a row this transaction inserted is its own until it commits), with the lowest
   *  free network index below `maxProjects` (NoFreeNetIndex when none is). Two first boxes of
   *  new projects at once can pick the same index: the loser's insert fails on the unique index
   *  inside a savepoint (so a Postgres transaction around it stays usable) and it looks again. */
  async ensure(db: Db, name: string, maxProjects: number, opts: { lock?: boolean } = {}): Promise<ProjectRow> {
    for (let attempt = 0; ; attempt++) {
      const existing = await projectsRepo.get(db, name, opts);
      if (existing) return existing;
      const used = new Set((await db<ProjectRow>('projects').pluck('net_index')) as number[]);
      let index = 0;
      while (used.has(index)) index++;
      if (index >= maxProjects) throw new NoFreeNetIndex(maxProjects);
      const row: ProjectRow = { name, net_index: index, created_at: now(), quotas: null };
      try {
        await db.transaction((sp) => sp<ProjectRow>('projects').insert(row));
        return row;
      } catch (e) {
        if (!isUniqueViolation(e) || attempt >= 20) throw e;
      }
    }
  },
  /** Node id → how many box rows of the project it holds (every status: a box being deleted
   *  still holds its address until its delete is done). */
  async boxesByNode(db: Db, name: string): Promise<Map<string, number>> {
    const rows = await db('boxes').where({ project: name }).select('node').count({ n: '*' }).groupBy('node');
    return new Map(rows.map((r: any) => [String(r.node), Number(r.n)]));
  },
  boxCounts: async (db: Db): Promise<Map<string, number>> => {
    const rows = await db('boxes').select('project').count({ n: '*' }).groupBy('project');
    return new Map(rows.map((r: any) => [r.project, Number(r.n)]));
  },
};
