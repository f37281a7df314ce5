import type { Db } from '../knex';
import { now } from '../../core/ids';
import type { BaseProvenance } from '../../core/apiTypes';

/** The provenance a save or an import stores, each field set or null. */
export type BaseMeta = { [K in keyof Required<BaseProvenance>]: string | null };

export interface BaseRow extends BaseMeta {
  name: string;
  version: string;
  size_bytes: number;
  created_at: string;
  /** `making` while its save or import job runs; `ready` after (db/migrations/008_bases.ts). */
  state: 'making' | 'ready';
  origin: 'builtin' | 'saved' | 'imported' | 'built';
  /** The owner project of a saved base; null: every project's. */
  project: string | null;
  /** The node whose pool holds it; null: every node makes its own (built-in bases). */
  node: string | null;
  /** sha256 of an imported archive as uploaded. */
  sha256: string | null;
  created_by: string | null;
}

export const NO_META: BaseMeta = { builder: null, parent: null, parent_alias: null, parent_version: null, script: null, script_sha256: null };

const ready = (db: Db) => db<BaseRow>('bases').where({ state: 'ready' });

export const basesRepo = {
  /**
   * Serialises, until the transaction ends, every transaction that decides who owns `name`
   * (a save and an import of a new name at once would otherwise both see it free). Postgres: a
   * transaction-scoped advisory lock; sqlite runs one writer at a time already.
   */
  async lockName(trx: Db, name: string): Promise<void> {
    if ((trx.client.config as { client?: string }).client === 'pg') await trx.raw('select pg_advisory_xact_lock(hashtext(?))', [`boxhost-base:${name}`]);
  },
  /** Records a built-in base version once (each node makes its own copy); a second call keeps the first record. */
  async ensure(db: Db, b: Pick<BaseRow, 'name' | 'version' | 'size_bytes'>): Promise<void> {
    await db<BaseRow>('bases').insert({ ...NO_META, ...b, created_at: now(), state: 'ready', origin: 'builtin', project: null, node: null, sha256: null, created_by: null }).onConflict(['name', 'version']).ignore();
  },
  /** Takes name@version for a base being made; false when it is taken. */
  /** `size_bytes`: what it is expected to take (an import's unpacked size), counted until the
   *  job records what it came to; else 0. */
  async reserve(db: Db, row: Omit<BaseRow, 'state' | 'size_bytes' | 'created_at'> & { size_bytes?: number }): Promise<boolean> {
    const inserted = await db<BaseRow>('bases').insert({ size_bytes: 0, ...row, state: 'making', created_at: now() }).onConflict(['name', 'version']).ignore().returning('name');
    return inserted.length > 0;
  },
  async markReady(db: Db, name: string, version: string, sizeBytes: number): Promise<void> {
    await db<BaseRow>('bases').where({ name, version }).update({ state: 'ready', size_bytes: sizeBytes });
  },
  update: (db: Db, name: string, version: string, patch: Partial<Pick<BaseRow, 'state' | 'size_bytes' | 'node'>>) => db<BaseRow>('bases').where({ name, version }).update(patch),
  /** Forgets a version still being made (its job failed for good). */
  async dropMaking(db: Db, name: string, version: string): Promise<void> {
    await db<BaseRow>('bases').where({ name, version, state: 'making' }).delete();
  },
  async remove(db: Db, name: string, version: string): Promise<void> {
    await db<BaseRow>('bases').where({ name, version }).delete();
  },
  /** The bytes of `project`'s bases (what its storage quota counts, db/json.ts basesGb). */
  bytesOwned: async (db: Db, project: string) =>
    Number(((await db<BaseRow>('bases').where({ project }).first(db.raw('coalesce(sum(size_bytes), 0) as b'))) as { b: number | string } | undefined)?.b ?? 0),
  /** Versions (any state) saved in `project`, or imported (`null`). */
  countOwned: async (db: Db, project: string | null) =>
    Number((await (project === null ? db<BaseRow>('bases').whereNull('project').whereNot({ origin: 'builtin' }) : db<BaseRow>('bases').where({ project })).count<{ n: number | string }[]>({ n: '*' }))[0]?.n ?? 0),
  /** Any version of a name, whatever its state (who owns the name). */
  anyOf: (db: Db, name: string) => db<BaseRow>('bases').where({ name }).first(),
  get: (db: Db, name: string, version: string) => ready(db).where({ name, version }).first(),
  /** Including versions being made. */
  getAny: (db: Db, name: string, version: string) => db<BaseRow>('bases').where({ name, version }).first(),
  /** `<name>` means its newest ready version. */
  newest: (db: Db, name: string) => ready(db).where({ name }).orderBy('created_at', 'desc').orderBy('version').first(),
  versions: (db: Db, name: string) => ready(db).where({ name }).orderBy('created_at', 'desc'),
  list: (db: Db) => ready(db).orderBy('name').orderBy('created_at', 'desc'),
};
