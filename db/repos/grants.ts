import type { Db } from '../knex';
import type { Grant } from '../../core/apiTypes';

export interface GrantRow {
  name: string;
  permissions: string;
  repositories: string;
  created_at: string;
  updated_at: string;
}

export type { Grant };

export const toGrant = (r: GrantRow): Grant => ({
  name: r.name,
  permissions: JSON.parse(r.permissions),
  repositories: JSON.parse(r.repositories),
  created_at: r.created_at,
  updated_at: r.updated_at,
});

const toRow = (g: Grant): GrantRow => ({ ...g, permissions: JSON.stringify(g.permissions), repositories: JSON.stringify(g.repositories) });

export const grantsRepo = {
  get: (db: Db, name: string) => db<GrantRow>('grants').where({ name }).first(),
  list: (db: Db) => db<GrantRow>('grants').orderBy('name'),
  insert: (db: Db, g: Grant) => db<GrantRow>('grants').insert(toRow(g)),
  update: (db: Db, g: Grant) => db<GrantRow>('grants').where({ name: g.name }).update(toRow(g)),
  remove: (db: Db, name: string) => db<GrantRow>('grants').where({ name }).delete(),
};
