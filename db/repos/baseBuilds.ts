import type { Db } from '../knex';
import { now } from '../../core/ids';

export interface BaseBuildRow {
  id: string;
  status: 'queued' | 'running' | 'succeeded' | 'failed';
  base: string;
  version: string;
  /** `name@version`, resolved when the build was asked for. */
  parent: string;
  script: string;
  cached: boolean | number;
  force: boolean | number;
  project: string;
  owner: string | null;
  box_id: string | null;
  box: string | null;
  script_started: boolean | number;
  script_done: boolean | number;
  reserved: boolean | number;
  replaced: boolean | number;
  exit_code: number | null;
  error: string | null;
  log_bytes: number | string;
  created_by: string | null;
  created_at: string;
  updated_at: string;
}

/** The most log a build keeps (the rest is cut, and the log says so). */
export const MAX_BUILD_LOG_BYTES = 8 * 1024 * 1024;

export const baseBuildsRepo = {
  get: (db: Db, id: string) => db<BaseBuildRow>('base_builds').where({ id }).first(),
  insert: (db: Db, row: BaseBuildRow) => db<BaseBuildRow>('base_builds').insert(row),
  update: (db: Db, id: string, patch: Partial<BaseBuildRow>) => db<BaseBuildRow>('base_builds').where({ id }).update({ ...patch, updated_at: now() }),
  /** The build of `base@version` still queued or running, if any. */
  /** The newest build of base@version, whatever its status. */
  latest: (db: Db, base: string, version: string) => db<BaseBuildRow>('base_builds').where({ base, version }).orderBy('created_at', 'desc').first(),
  active: (db: Db, base: string, version: string) => db<BaseBuildRow>('base_builds').where({ base, version }).whereIn('status', ['queued', 'running']).first(),
  async appendLog(db: Db, id: string, text: string): Promise<void> {
    if (!text) return;
    await db('base_build_logs').insert({ build_id: id, text });
    await db<BaseBuildRow>('base_builds').where({ id }).update({ log_bytes: db.raw('log_bytes + ?', [Buffer.byteLength(text)]) as unknown as number });
  },
  /** Log chunks after `afterSeq`, in order. */
  logSince: async (db: Db, id: string, afterSeq: number): Promise<{ seq: number; text: string }[]> =>
    (await db('base_build_logs').where('build_id', id).where('seq', '>', afterSeq).orderBy('seq').select('seq', 'text')) as { seq: number; text: string }[],
  clearLog: (db: Db, id: string) => db('base_build_logs').where({ build_id: id }).delete(),
  /** Builds not ended. */
  unfinished: (db: Db) => db<BaseBuildRow>('base_builds').whereIn('status', ['queued', 'running']),
};
