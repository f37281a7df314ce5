import type { Db } from '../knex';
import { fromJson, toJson } from '../json';
import type { Token as ApiToken } from '../../core/apiTypes';

export interface TokenRow {
  id: string;
  name: string;
  secret_hash: string;
  projects: string | null;
  created_at: string;
  expires_at: string | null;
  last_used_at: string | null;
  scopes?: string | null;
}

/** A token as the api shows it (only a create answer adds the secret). */
export type Token = Omit<ApiToken, 'token'>;

export const toToken = (r: TokenRow): Token => ({
  id: r.id,
  name: r.name,
  projects: fromJson<string[]>(r.projects),
  created_at: r.created_at,
  expires_at: r.expires_at,
  last_used_at: r.last_used_at,
  ...(fromJson<string[]>(r.scopes ?? null)?.length ? { scopes: fromJson<string[]>(r.scopes ?? null)! } : {}),
});

export const tokensRepo = {
  insert: (db: Db, t: Omit<Token, 'last_used_at'> & { secret_hash: string }) =>
    db<TokenRow>('tokens').insert({ ...t, projects: toJson(t.projects), scopes: t.scopes?.length ? toJson(t.scopes) : null, last_used_at: null }),
  findByHash: (db: Db, hash: string) => db<TokenRow>('tokens').where({ secret_hash: hash }).first(),
  byId: (db: Db, id: string) => db<TokenRow>('tokens').where({ id }).first(),
  list: (db: Db) => db<TokenRow>('tokens').orderBy('created_at', 'asc'),
  remove: (db: Db, id: string) => db<TokenRow>('tokens').where({ id }).delete(),
  touch: (db: Db, id: string, at: string) => db<TokenRow>('tokens').where({ id }).update({ last_used_at: at }),
};
