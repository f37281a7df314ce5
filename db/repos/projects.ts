import type { Db } from '../knex';
import { now } from '../../core/ids';
import { isUniqueViolation } from '../errors';

export interface ProjectRow {
  name: string;
  net_index: number;
  created_at: string;
}

/** A project's bridge takes a /24 of the box subnet: 256 projects per host. */
export const MAX_PROJECTS = 256;

export const projectsRepo = {
  get: (db: Db, name: string) => db<ProjectRow>('projects').where({ name }).first(),
  list: (db: Db) => db<ProjectRow>('projects').orderBy('name'),
  /** Projects come into being with their first box; this finds or makes one, with the lowest
   *  free network index. Two first boxes of new projects at once can pick the same index: the
   *  loser's insert fails on the unique index inside a savepoint (so a Postgres transaction
   *  around it stays usable) and it looks again. */
  async ensure(db: Db, name: string): Promise<ProjectRow> {
    for (let attempt = 0; ; attempt++) {
      const existing = await projectsRepo.get(db, name);
      if (existing) return existing;
      const used = new Set((await db<ProjectRow>('projects').pluck('net_index')) as number[]);
      let index = 0;
      while (used.has(index)) index++;
      if (index >= MAX_PROJECTS) throw new Error(`this host holds ${MAX_PROJECTS} projects already`);
      const row = { name, net_index: index, created_at: now() };
      try {
        await db.transaction((sp) => sp<ProjectRow>('projects').insert(row));
        return row;
      } catch (e) {
        if (!isUniqueViolation(e) || attempt >= 20) throw e;
      }
    }
  },
  boxCounts: async (db: Db): Promise<Map<string, number>> => {
    const rows = await db('boxes').select('project').count({ n: '*' }).groupBy('project');
    return new Map(rows.map((r: any) => [r.project, Number(r.n)]));
  },
};
