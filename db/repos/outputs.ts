import type { Db } from '../knex';
import { now } from '../../core/ids';

/** A box's `env_from` entry as kept (db/migrations/015_outputs.ts); `keys`, `own`: JSON arrays. */
export interface EnvLinkRow {
  box_id: string;
  position: number;
  alias: string;
  source: string;
  keys: string;
  own: string;
}

/** Who holds the secrets of a deploy line's generations (`instance_secrets.box_id`). */
export const secretOwner = (project: string, line: string) => `line:${project}/${line}`;

export const outputsRepo = {
  links: (db: Db, boxId: string) => db<EnvLinkRow>('env_links').where({ box_id: boxId }).orderBy('position'),
  insertLinks: async (db: Db, rows: EnvLinkRow[]) => {
    if (rows.length > 0) await db<EnvLinkRow>('env_links').insert(rows);
  },
  updateKeys: (db: Db, boxId: string, position: number, keys: string) => db<EnvLinkRow>('env_links').where({ box_id: boxId, position }).update({ keys }),
  secret: async (db: Db, boxId: string, name: string) =>
    ((await db('instance_secrets').where({ box_id: boxId, name }).first()) as { value: string } | undefined)?.value,
  putSecret: (db: Db, boxId: string, name: string, value: string) =>
    db('instance_secrets').insert({ box_id: boxId, name, value, created_at: now() }).onConflict(['box_id', 'name']).ignore(),
  /** `to` gets the secrets of `from` (a new deploy line those its first box made). */
  async copySecrets(db: Db, from: string, to: string): Promise<void> {
    const rows = (await db('instance_secrets').where({ box_id: from })) as { name: string; value: string }[];
    for (const r of rows) await db('instance_secrets').insert({ box_id: to, name: r.name, value: r.value, created_at: now() }).onConflict(['box_id', 'name']).ignore();
  },
  async forgetBox(db: Db, boxId: string): Promise<void> {
    await db('env_links').where({ box_id: boxId }).delete();
    await db('instance_secrets').where({ box_id: boxId }).delete();
  },
};
