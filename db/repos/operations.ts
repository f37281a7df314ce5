import type { Db } from '../knex';
import { now } from '../../core/ids';

export type OperationStatus = 'queued' | 'running' | 'succeeded' | 'failed';

export interface OperationRow {
  seq: number;
  id: string;
  kind: string;
  status: OperationStatus;
  resource: string;
  box_id: string | null;
  /** The project whose tokens may read it (null: host-wide, unlimited tokens only). */
  project: string | null;
  /** The node whose queue holds its job. */
  node: string | null;
  progress: number | null;
  error: string | null;
  payload: string;
  created_by: string | null;
  created_at: string;
  updated_at: string;
}

export interface OperationFilter {
  /** Only these projects' operations (null: every one, host-wide ones included). */
  projects: string[] | null;
  project?: string;
  /** Operations on this box: its id, or its path (a deleted box's operations name it still). */
  box?: { id?: string; resource: string };
  statuses?: OperationStatus[];
  kind?: string;
  /** Only operations older than this one (the page before). */
  beforeSeq?: number;
  limit: number;
}

/** Rows one prune statement drops at most. */
const PRUNE_BATCH = 1000;

export const isFinished = (s: OperationStatus) => s === 'succeeded' || s === 'failed';

export const operationsRepo = {
  get: (db: Db, id: string) => db<OperationRow>('operations').where({ id }).first(),
  insert: (db: Db, row: Omit<OperationRow, 'seq'>) => db<OperationRow>('operations').insert(row),
  /** Inserts the row and answers it whole (its `seq` as the database gave it), without reading it back. */
  insertReturning: async (db: Db, row: Omit<OperationRow, 'seq'>): Promise<OperationRow> => {
    const [r] = (await db<OperationRow>('operations').insert(row).returning('seq')) as unknown as ({ seq: number } | number)[];
    return { ...row, seq: Number(typeof r === 'object' ? r.seq : r) };
  },
  remove: (db: Db, id: string) => db<OperationRow>('operations').where({ id }).delete(),
  update: (db: Db, id: string, patch: Partial<Pick<OperationRow, 'status' | 'progress' | 'error'>>) =>
    db<OperationRow>('operations').where({ id }).update({ ...patch, updated_at: now() }),
  /** An unfinished operation on the same box that arrived earlier: this one waits for it. */
  earlierUnfinished: (db: Db, boxId: string, seq: number) =>
    db<OperationRow>('operations')
      .where({ box_id: boxId })
      .andWhere('seq', '<', seq)
      .whereIn('status', ['queued', 'running'])
      .orderBy('seq')
      .first(),
  failOnNode: (db: Db, node: string, error: string) =>
    db<OperationRow>('operations').where({ node }).whereIn('status', ['queued', 'running']).update({ status: 'failed', error, updated_at: now() }),
  /** The unfinished operations queued on one node. */
  unfinishedOnNode: (db: Db, node: string) => db<OperationRow>('operations').where({ node }).whereIn('status', ['queued', 'running']).orderBy('seq'),
  /** Newest first; one more than `limit` tells whether a page follows. */
  page(db: Db, f: OperationFilter) {
    const q = db<OperationRow>('operations').orderBy('seq', 'desc').limit(f.limit + 1);
    if (f.projects) q.whereIn('project', f.projects);
    if (f.project) q.where({ project: f.project });
    const box = f.box;
    if (box) q.where((w) => { w.where({ resource: box.resource }); if (box.id) w.orWhere({ box_id: box.id }); });
    if (f.statuses) q.whereIn('status', f.statuses);
    if (f.kind) q.where({ kind: f.kind });
    if (f.beforeSeq !== undefined) q.where('seq', '<', f.beforeSeq);
    return q as Promise<OperationRow[]>;
  },
  /** Drops finished operations last changed before `before` (an ISO instant), a thousand at a
   *  time (a first sweep after an upgrade holds no long write lock); unfinished ones stay. */
  async pruneFinished(db: Db, before: string): Promise<number> {
    let dropped = 0;
    for (;;) {
      const batch = db<OperationRow>('operations').select('seq').whereIn('status', ['succeeded', 'failed']).andWhere('updated_at', '<', before).limit(PRUNE_BATCH);
      const n = await db<OperationRow>('operations').whereIn('seq', batch).delete();
      dropped += n;
      if (n < PRUNE_BATCH) return dropped;
    }
  },
  unfinishedForBox: (db: Db, boxId: string) =>
    db<OperationRow>('operations').where({ box_id: boxId }).whereIn('status', ['queued', 'running']).orderBy('seq'),
};
