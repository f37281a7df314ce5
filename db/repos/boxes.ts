import type { Db } from '../knex';
import { fromJson, toJson } from '../json';
import { now } from '../../core/ids';
import { deploysRepo } from './deploys';
import { outputsRepo } from './outputs';
import type { BoxStatus } from '../../core/box';
import type { BoxConfig, DataMount as ApiDataMount } from '../../core/apiTypes';

export type { BoxStatus, BoxConfig };

/** A data mount as stored (the api adds `ownership`). */
export type DataMount = Omit<ApiDataMount, 'ownership'>;

export interface BoxRow {
  id: string;
  project: string;
  name: string;
  status: BoxStatus;
  error: string | null;
  base: string | null;
  fork: string | null;
  config: string;
  environment: string | null;
  tags: string | null;
  data_mounts: string | null;
  lifecycle: string | null;
  pack: string | null;
  pack_rev: string | null;
  rollback_to: string | null;
  termination_grace_period_seconds: number | null;
  url_settings: string | null;
  node: string;
  address: string | null;
  created_at: string;
  updated_at: string;
}

/** A box row with its JSON columns decoded: what services and jobs work with. */
export interface BoxRecord extends Omit<BoxRow, 'config' | 'environment' | 'tags' | 'data_mounts' | 'url_settings'> {
  config: BoxConfig;
  environment: Record<string, string>;
  tags: Record<string, string>;
  data_mounts: DataMount[];
  url_settings: { auth: string } | null;
}

export const decodeBox = (r: BoxRow): BoxRecord => ({
  ...r,
  config: JSON.parse(r.config),
  environment: fromJson<Record<string, string>>(r.environment) ?? {},
  tags: fromJson<Record<string, string>>(r.tags) ?? {},
  data_mounts: fromJson<DataMount[]>(r.data_mounts) ?? [],
  url_settings: fromJson(r.url_settings),
});

const encode = (b: Partial<BoxRecord>): Partial<BoxRow> => {
  const out: Record<string, unknown> = { ...b };
  for (const k of ['config', 'environment', 'tags', 'data_mounts', 'url_settings'] as const) {
    if (k in b) out[k] = k === 'config' ? JSON.stringify(b[k]) : toJson(b[k]);
  }
  return out as Partial<BoxRow>;
};

/** The keyset a list page continues after: (project, name). */
export interface ListCursor {
  project: string;
  name: string;
}

export interface ListFilter {
  projects: string[] | null;
  prefix?: string;
  after?: ListCursor;
  limit: number;
}

export const boxesRepo = {
  /** `lock`: FOR UPDATE inside a transaction (Postgres; sqlite serialises writers anyway). */
  get: async (db: Db, project: string, name: string, opts: { lock?: boolean } = {}) => {
    const q = db<BoxRow>('boxes').where({ project, name }).first();
    const r = await (opts.lock ? q.forUpdate() : q);
    return r ? decodeBox(r) : undefined;
  },
  byId: async (db: Db, id: string, opts: { lock?: boolean } = {}) => {
    const q = db<BoxRow>('boxes').where({ id }).first();
    const r = await (opts.lock ? q.forUpdate() : q);
    return r ? decodeBox(r) : undefined;
  },
  insert: (db: Db, b: BoxRecord) => db<BoxRow>('boxes').insert(encode(b) as BoxRow),
  /** creating → running, only from creating (a delete that came meanwhile keeps its status). */
  /** creating → running, with the address its start took (one write). */
  markCreated: (db: Db, id: string, address: string) => db<BoxRow>('boxes').where({ id, status: 'creating' }).update({ status: 'running', error: null, address, updated_at: now() }),
  update: (db: Db, id: string, patch: Partial<BoxRecord>) => db<BoxRow>('boxes').where({ id }).update({ ...encode(patch), updated_at: now() }),
  /** The row and what hangs on it (its publishes). */
  remove: async (db: Db, id: string) => {
    await db('publishes').where({ box_id: id }).delete();
    await db('data_attachments').where({ box_id: id }).delete();
    await deploysRepo.forgetBox(db, id);
    await outputsRepo.forgetBox(db, id);
    return db<BoxRow>('boxes').where({ id }).delete();
  },
  /** Boxes (of any project, in any state) made from one of these `name@version` bases. */
  countByBase: async (db: Db, bases: string[]) => Number((await db<BoxRow>('boxes').whereIn('base', bases).count<{ n: number | string }[]>({ n: '*' }))[0]?.n ?? 0),
  onNode: async (db: Db, node: string) => (await db<BoxRow>('boxes').where({ node })).map(decodeBox),
  failOnNode: (db: Db, node: string, error: string) => db<BoxRow>('boxes').where({ node }).update({ status: 'failed', error, address: null, updated_at: now() }),
  /** One page of boxes in (project, name) order, after the cursor. */
  async page(db: Db, f: ListFilter): Promise<BoxRecord[]> {
    const q = db<BoxRow>('boxes').orderBy([{ column: 'project' }, { column: 'name' }]).limit(f.limit);
    if (f.projects) q.whereIn('project', f.projects);
    // Prefixes are validated to [a-z0-9-]: no LIKE wildcard can reach here.
    if (f.prefix) q.where('name', 'like', `${f.prefix}%`);
    if (f.after) {
      const { project, name } = f.after;
      q.where((w) => w.where('project', '>', project).orWhere((w2) => w2.where('project', project).andWhere('name', '>', name)));
    }
    return (await q).map(decodeBox);
  },
};
