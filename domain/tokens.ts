import crypto from 'node:crypto';
import type { Db } from '../db/knex';
import { Token, toToken, tokensRepo } from '../db/repos/tokens';
import { newId, now, sha256 } from '../core/ids';
import type { Identity } from './context';
import { conflict, notFound, forbidden } from '../core/errors';

export const ADMIN_TOKEN_ID = 'tok_admin';

/** Secrets are 32 random bytes; a single sha256 is enough to store them (no password to stretch). */
/** What every token the api makes begins with. */
export const TOKEN_PREFIX = 'bxh_';
export const newSecret = () => `${TOKEN_PREFIX}${crypto.randomBytes(32).toString('base64url')}`;

/** Touch last_used_at at most this often per token, so auth costs no write on most requests. */
const TOUCH_EVERY_MS = 60_000;

export async function authenticate(db: Db, adminTokenHash: string, secret: string): Promise<Identity | null> {
  const hash = sha256(secret);
  if (crypto.timingSafeEqual(Buffer.from(hash), Buffer.from(adminTokenHash))) {
    return { tokenId: ADMIN_TOKEN_ID, name: 'admin', projects: null };
  }
  const row = await tokensRepo.findByHash(db, hash);
  if (!row) return null;
  const at = Date.now();
  if (row.expires_at && Date.parse(row.expires_at) <= at) return null;
  if (!row.last_used_at || at - Date.parse(row.last_used_at) > TOUCH_EVERY_MS) {
    await tokensRepo.touch(db, row.id, new Date(at).toISOString());
  }
  const token = toToken(row);
  return { tokenId: row.id, name: row.name, projects: token.projects, ...(token.scopes ? { scopes: token.scopes } : {}) };
}

export interface CreateTokenRequest {
  name: string;
  projects?: string[] | null;
  expires_in?: number | null;
  scopes?: string[];
}

export async function createToken(db: Db, caller: Identity, req: CreateTokenRequest): Promise<Token & { token: string }> {
  // A token can hand out at most what it holds: a project-limited caller is refused earlier
  // (admin routes), so any limit asked for here is a narrowing.
  if (caller.projects !== null) throw forbidden('a project-limited token cannot create tokens');
  const secret = newSecret();
  const created = now();
  const token: Omit<Token, 'last_used_at'> = {
    id: newId('tok'),
    name: req.name,
    projects: req.projects ?? null,
    ...(req.scopes?.length ? { scopes: req.scopes } : {}),
    created_at: created,
    expires_at: req.expires_in ? new Date(Date.parse(created) + req.expires_in * 1000).toISOString() : null,
  };
  await tokensRepo.insert(db, { ...token, secret_hash: sha256(secret) });
  return { ...token, last_used_at: null, token: secret };
}

export const listTokens = async (db: Db) => (await tokensRepo.list(db)).map(toToken);

export async function deleteToken(db: Db, id: string): Promise<void> {
  if (id === ADMIN_TOKEN_ID) throw conflict('the bootstrap admin token comes from the host configuration and cannot be deleted');
  if (!(await tokensRepo.remove(db, id))) throw notFound(`token ${id}`);
}
