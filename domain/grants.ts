import type { Db } from '../db/knex';
import { Grant, grantsRepo, toGrant } from '../db/repos/grants';
import { now } from '../core/ids';
import { isUniqueViolation } from '../db/errors';
import { conflict, invalidField, notFound } from '../core/errors';

export interface GrantInput {
  name: string;
  permissions: Record<string, string>;
  repositories: string[];
}

export async function createGrant(db: Db, input: GrantInput): Promise<Grant> {
  const at = now();
  const grant: Grant = { ...input, created_at: at, updated_at: at };
  try {
    await grantsRepo.insert(db, grant);
  } catch (e) {
    if (isUniqueViolation(e)) throw conflict(`grant ${input.name} already exists`);
    throw e;
  }
  return grant;
}

export async function getGrant(db: Db, name: string): Promise<Grant> {
  const row = await grantsRepo.get(db, name);
  if (!row) throw notFound(`grant ${name}`);
  return toGrant(row);
}

export const listGrants = async (db: Db) => (await grantsRepo.list(db)).map(toGrant);

/**
 * PUT replaces the fields given; absent fields stay. A body may repeat the grant's own `name`
 * (a record read with GET and sent back whole); a grant is never renamed, so any other name is
 * refused rather than ignored.
 */
export async function updateGrant(db: Db, name: string, patch: Partial<GrantInput>): Promise<Grant> {
  const { name: named, ...fields } = patch;
  if (named !== undefined && named !== name) throw invalidField('name', `must be the grant's own name, ${name} (a grant cannot be renamed)`);
  return db.transaction(async (trx) => {
    const current = await getGrant(trx, name);
    const next: Grant = { ...current, ...fields, updated_at: now() };
    await grantsRepo.update(trx, next);
    return next;
  });
}

export async function deleteGrant(db: Db, name: string): Promise<void> {
  if (!(await grantsRepo.remove(db, name))) throw notFound(`grant ${name}`);
}

