import type { DomainContext, Identity } from './context';
import type { Pack, PackManifest, PackRevision, PackRevisionSpec } from '../core/apiTypes';
import { BoxhostError, conflict, forbidden, invalidField, notFound } from '../core/errors';
import { checkStart } from '../core/services';
import { now } from '../core/ids';
import { manifestHash, revisionHash } from '../core/packs';
import { packsRepo, type PackRow } from '../db/repos/packs';

/**
 * Packs (docs/packs.md): installable recipes for a kind of box. A manifest names revisions by
 * labels of its author's choosing and one of them as the default; each revision is kept by its
 * content hash, which is what an instance pins. Packs are the installation's (every project's),
 * so installing and deleting take a token without a project limit; any token reads them.
 */

/** Rules the schema cannot say: the default is one of the revisions; inside each revision,
 *  service names are unique, `secret_env` are keys of `env`, a publish has a port. */
function checkManifest(m: PackManifest): void {
  if (!(m.default_rev in m.revisions)) throw invalidField('default_rev', `is not one of the revisions (${Object.keys(m.revisions).join(', ')})`);
  for (const [label, r] of Object.entries(m.revisions)) {
    const seen = new Set<string>();
    for (const [i, s] of (r.services ?? []).entries()) {
      const at = `revisions.${label}.services.${i}`;
      if (seen.has(s.name)) throw invalidField(`${at}.name`, `service ${s.name} is named twice`);
      seen.add(s.name);
      for (const k of s.secret_env ?? []) if (!(k in (s.env ?? {}))) throw invalidField(`${at}.secret_env`, `${k} is not a key of env`);
      if (s.publish && s.port === undefined) throw invalidField(`${at}.publish`, 'a publish needs port');
      try {
        checkStart(s);
      } catch (e) {
        const d = e instanceof BoxhostError ? e.details[0] : undefined;
        throw invalidField(`${at}.${d?.field ?? 'ready'}`, d?.issue ?? (e as Error).message);
      }
    }
  }
}

function toPack(row: PackRow, instances: number): Pack {
  const m = JSON.parse(row.manifest) as PackManifest;
  const revisions: Record<string, PackRevision> = {};
  for (const [label, spec] of Object.entries(m.revisions)) revisions[label] = { rev: revisionHash(spec), ...spec };
  return { name: row.name, description: row.description, rev: row.rev, default_rev: row.default_rev, revisions, instances, created_at: row.created_at, updated_at: row.updated_at };
}

/** Installs a manifest (201 with the pack); the same content again changes nothing. */
export async function installPack(ctx: DomainContext, identity: Identity, m: PackManifest): Promise<Pack> {
  if (identity.projects !== null) throw forbidden('packs are every project\'s: installing one takes a token without a project limit');
  checkManifest(m);
  const rev = manifestHash(m);
  const had = await packsRepo.get(ctx.db, m.name);
  if (!had || had.rev !== rev) {
    const at = now();
    const revisions = Object.values(m.revisions).map((spec) => ({ rev: revisionHash(spec), content: JSON.stringify(spec) }));
    await packsRepo.put(ctx.db, { name: m.name, description: m.description ?? null, rev, default_rev: m.default_rev, manifest: JSON.stringify(m), created_by: identity.name, created_at: at, updated_at: at }, revisions);
  }
  return getPack(ctx, m.name);
}

export async function listPacks(ctx: DomainContext): Promise<Pack[]> {
  const rows = await packsRepo.list(ctx.db);
  return Promise.all(rows.map(async (r) => toPack(r, await packsRepo.instances(ctx.db, r.name))));
}

export async function getPack(ctx: DomainContext, name: string): Promise<Pack> {
  const row = await packsRepo.get(ctx.db, name);
  if (!row) throw notFound(`pack ${name}`);
  return toPack(row, await packsRepo.instances(ctx.db, name));
}

/** 204; 409 while boxes are instances of it. */
export async function deletePack(ctx: DomainContext, identity: Identity, name: string): Promise<void> {
  if (identity.projects !== null) throw forbidden('packs are every project\'s: deleting one takes a token without a project limit');
  await ctx.db.transaction(async (trx) => {
    // Locked: an instance create takes the same row in its transaction, so none slips in between.
    if (!(await packsRepo.lock(trx, name))) throw notFound(`pack ${name}`);
    const n = await packsRepo.instances(trx, name);
    if (n > 0) throw conflict(`pack ${name} has ${n} instance${n === 1 ? '' : 's'}; delete ${n === 1 ? 'it' : 'them'} first`);
    await packsRepo.remove(trx, name);
  });
}

/** The default revision of an installed pack (`field` names the request field for a 404/400). */
export async function defaultRevision(ctx: DomainContext, name: string): Promise<{ rev: string; spec: PackRevisionSpec }> {
  const row = await packsRepo.get(ctx.db, name);
  if (!row) throw notFound(`pack ${name}`);
  const spec = (JSON.parse(row.manifest) as PackManifest).revisions[row.default_rev];
  return { rev: revisionHash(spec), spec };
}

/** A revision an instance pinned, kept by its hash even after the pack was installed again. */
export async function pinnedRevision(ctx: DomainContext, pack: string, rev: string): Promise<PackRevisionSpec> {
  const row = await packsRepo.revision(ctx.db, pack, rev);
  if (!row) throw notFound(`revision ${rev} of pack ${pack}`);
  return JSON.parse(row.content) as PackRevisionSpec;
}

/** A revision by what a caller names it (a deploy's `rev`): a label of the installed manifest
 *  or a stored revision's hash; by default the manifest's default revision. */
export async function revisionNamed(ctx: DomainContext, pack: string, rev: string | undefined): Promise<{ rev: string; spec: PackRevisionSpec }> {
  const row = await packsRepo.get(ctx.db, pack);
  if (!row) throw conflict(`pack ${pack} is no longer installed`);
  const manifest = JSON.parse(row.manifest) as { revisions: Record<string, PackRevisionSpec> };
  const label = rev ?? row.default_rev;
  const labelled = Object.hasOwn(manifest.revisions, label) ? manifest.revisions[label] : undefined;
  if (labelled) return { rev: revisionHash(labelled), spec: labelled };
  if (await packsRepo.revision(ctx.db, pack, label)) return { rev: label, spec: await pinnedRevision(ctx, pack, label) };
  throw invalidField('rev', `pack ${pack} has no revision ${label} (a label of its manifest or a revision hash)`);
}
