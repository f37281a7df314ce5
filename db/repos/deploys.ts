import type { Db } from '../knex';
import { now } from '../../core/ids';
import { secretOwner } from './outputs';

/** A deploy line (db/migrations/013_deploys.ts). */
export interface DeployLineRow {
  project: string;
  line: string;
  live_box_id: string;
  generation: number;
  deploy_op: string | null;
  switched_at: string | null;
  switched_by: string | null;
  created_at: string;
  updated_at: string;
}

export interface DeployGenerationRow {
  box_id: string;
  project: string;
  line: string;
  generation: number;
}

export const deploysRepo = {
  line: (db: Db, project: string, line: string) => db<DeployLineRow>('deploy_lines').where({ project, line }).first(),
  /** The row locked until the transaction ends (two deploys of one line take it in turn). */
  lockLine: (db: Db, project: string, line: string) => db<DeployLineRow>('deploy_lines').where({ project, line }).forUpdate().first(),
  insertLine: (db: Db, row: DeployLineRow) => db<DeployLineRow>('deploy_lines').insert(row),
  updateLine: (db: Db, project: string, line: string, patch: Partial<DeployLineRow>) =>
    db<DeployLineRow>('deploy_lines').where({ project, line }).update({ ...patch, updated_at: now() }),
  generationOf: (db: Db, boxId: string) => db<DeployGenerationRow>('deploy_generations').where({ box_id: boxId }).first(),
  generations: (db: Db, project: string, line: string) => db<DeployGenerationRow>('deploy_generations').where({ project, line }).orderBy('generation'),
  insertGeneration: (db: Db, row: DeployGenerationRow) => db<DeployGenerationRow>('deploy_generations').insert(row).onConflict('box_id').ignore(),
  /** A box removed: a line whose live box it was ends with it (its other boxes stay as boxes). */
  async forgetBox(db: Db, boxId: string): Promise<void> {
    const lines = await db<DeployLineRow>('deploy_lines').where({ live_box_id: boxId });
    for (const l of lines) {
      await db('instance_secrets').where({ box_id: secretOwner(l.project, l.line) }).delete();
      await db('deploy_generations').where({ project: l.project, line: l.line }).delete();
      await db('deploy_lines').where({ project: l.project, line: l.line }).delete();
    }
    await db('deploy_generations').where({ box_id: boxId }).delete();
  },
};
