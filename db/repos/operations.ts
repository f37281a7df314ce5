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
  unfinishedForBox: (db: Db, boxId: string) =>
    db<OperationRow>('operations').where({ box_id: boxId }).whereIn('status', ['queued', 'running']).orderBy('seq'),
};
