import crypto from 'node:crypto';
import type { Readable } from 'node:stream';
import type { DomainContext, Identity } from './context';
import type { Base, BaseProvenance, SaveBaseRequest } from '../core/apiTypes';
import type { NodeClient } from '../cluster/types';
import { basesRepo, BaseRow, NO_META } from '../db/repos/bases';
import { boxesRepo } from '../db/repos/boxes';
import { canSnapshot, describeState, projectedStatus } from '../core/box';
import { BoxhostError, conflict, forbidden, notFound } from '../core/errors';
import { baseJobs } from '../jobs/baseJobs';
import { resolveBase, visible } from './baseResolve';
import { unmadeRecipes } from './recipeBases';
import { recipeNamed } from '../core/recipeBases';
import { pendingActions } from './boxes';
import { loadBox } from './boxRef';
import type { Accepted } from './operations';
import { assertProject } from './access';
import { assertQuota } from './projects';
import { basesGb } from '../db/json';

/**
 * Bases (docs/bases.md): the built-in ones every node makes, those saved from a box (owned by
 * its project) and those imported from a tarball (everyone's). A version is made by a job on
 * one node, whose pool then holds it; boxes from it are placed there.
 */

export const basePath = (name: string, version: string) => `/v1/bases/${name}@${version}`;

export const toApiBase = (r: BaseRow): Base => ({
  name: r.name,
  version: r.version,
  created_at: r.created_at,
  size_bytes: Number(r.size_bytes),
  origin: r.origin,
  project: r.project,
  builder: r.builder,
  parent: r.parent,
  parent_alias: r.parent_alias,
  parent_version: r.parent_version,
  script: r.script,
  script_sha256: r.script_sha256,
});

export async function listBases(ctx: DomainContext, identity: Identity): Promise<Base[]> {
  const made = await basesRepo.list(ctx.db);
  // By name, newest first within one (an unmade recipe version is the newest of its name).
  return [...unmadeRecipes(made), ...made].filter((r) => visible(identity, r)).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)).map(toApiBase);
}

export async function getBase(ctx: DomainContext, identity: Identity, spec: string): Promise<Base> {
  const row = await resolveBase(ctx, identity, spec);
  if (!row) throw notFound(`base ${spec}`);
  return toApiBase(row);
}

const provenance = (p: BaseProvenance) => ({
  ...NO_META,
  ...Object.fromEntries(Object.entries(p).filter(([k, v]) => k in NO_META && v !== undefined)),
});

/** What a new base whose size is not known yet asks of its project's quota and its node. */
export const NEW_BASE = { cpus: 0, ram_mb: 0, storage_gb: 1 } as const;

/** Each project's saves hold at most BOXHOST_BASES_MAX_PER_PROJECT versions, and so do all
 *  imports together (their space is shared): one more → 409. */
export async function assertRoomForBase(db: DomainContext['db'], max: number, owner: string | null): Promise<void> {
  if ((await basesRepo.countOwned(db, owner)) >= max) {
    throw conflict(`${owner === null ? 'imported bases' : `project ${owner}`} hold ${max} base versions, the most there may be (BOXHOST_BASES_MAX_PER_PROJECT); delete one first`);
  }
}

/**
 * A name belongs to one owner: every version of `name` is the same project's (or everyone's).
 * Built-in names are the nodes' own.
 */
export async function assertNameFree(db: DomainContext['db'], identity: Identity, name: string, owner: string | null): Promise<void> {
  if (recipeNamed(name)) throw conflict(`base name ${name} is a built-in base's; pick another name`);
  const any = await basesRepo.anyOf(db, name);
  if (!any) return;
  if (any.origin === 'builtin') throw conflict(`base name ${name} is a built-in base's; pick another name`);
  if (any.project !== owner) throw conflict(`base name ${name} is taken${any.project === null ? ' by an imported base' : ' by another project'}; pick another name`);
  // A new version of an imported name becomes every project's `name`: only a token without a
  // project limit (the one kind that may delete it, too) adds one.
  if (owner === null && identity.projects !== null) throw forbidden(`base ${name} is shared by every project; only a token without a project limit can add a version to it`);
}

/** What an accepted save or import answers: the base as known so far (DESIGN.md §6); null
 *  once its job failed and took the record with it. */
const loader = (ctx: DomainContext, name: string, version: string) => async () => {
  const row = await basesRepo.getAny(ctx.db, name, version);
  return row ? toApiBase(row) : null;
};

/**
 * Saves a box as a base (202 + operation): a job in turn with the box's operations on its node.
 * The version is the build rule's hash when the request names `parent_alias` and `script` (a
 * client-side build: the same inputs give the same version, a second save of them is a 409),
 * else a new random one.
 */
export async function saveBase(ctx: DomainContext, identity: Identity, project: string, req: SaveBaseRequest): Promise<Accepted<Base>> {
  const current = await loadBox(ctx, identity, project, req.box);
  await ctx.nodes.assertUp(current.node);
  await assertNameFree(ctx.db, identity, req.name, project);
  // A GB of its node's promised storage too (507 when it has none: docs/bases.md "Space").
  await ctx.nodes.assertRoom(current.node, NEW_BASE);
  const version = req.parent_alias && req.script ? buildVersion(req.parent_alias, req.parent_version ?? null, req.script) : crypto.randomBytes(6).toString('hex');
  const operation = await ctx.db.transaction(async (trx) => {
    const box = await loadBox({ db: trx }, identity, project, req.box, { lock: true });
    // Its size is known once it is made (then it counts, docs/bases.md "Space"): a save asks for
    // a GB of the project's storage quota to be free. Locks: the box, its project, the name (as
    // a volume attach locks box then project, and an import project then name).
    await assertQuota(ctx, trx, project, { boxes: 0, ...NEW_BASE });
    await basesRepo.lockName(trx, req.name);
    await assertNameFree(trx, identity, req.name, project);
    await assertRoomForBase(trx, ctx.config.basesPerProject, project);
    const projected = projectedStatus(box.status, await pendingActions(trx, box.id));
    if (box.status === 'creating' || !canSnapshot(projected)) {
      const shown = box.status === 'creating' ? 'creating' : describeState(box.status, projected);
      throw conflict(`box ${project}/${req.box} is ${shown}; it can be saved as a base when running or stopped`);
    }
    const reserved = await basesRepo.reserve(trx, {
      name: req.name, version, origin: 'saved', project, node: box.node, sha256: null, created_by: identity.name, ...provenance(req),
    });
    if (!reserved) throw conflict(`base ${req.name}@${version} already exists`);
    return ctx.queue.enqueue(trx, baseJobs.save.of({ boxId: box.id, name: req.name, version }), {
      resource: basePath(req.name, version), node: box.node, project, boxId: box.id, createdBy: identity.name,
    });
  });
  return { operation, load: loader(ctx, req.name, version) };
}

/** DESIGN.md §6: first 12 hex of sha256(`<parent>@<parent version or "">\n<script>`). */
export const buildVersion = (parent: string, parentVersion: string | null, script: string) =>
  crypto.createHash('sha256').update(`${parent}@${parentVersion ?? ''}\n${script}`).digest('hex').slice(0, 12);

export interface ImportRequest extends BaseProvenance {
  name: string;
  /** The project whose base it is; absent: a project-limited token's first project, or with a
   *  token without a limit every project's. */
  project?: string;
}

/**
 * Who an import belongs to. A project-limited token's import is its project's, as a save is:
 * one every project shared would let one project put its files under a name (`python`) others
 * create boxes from. Only a token without a limit makes an everyone's base.
 */
function importOwner(identity: Identity, project: string | undefined): string | null {
  if (project !== undefined) {
    assertProject(identity, project, `project ${project}`);
    return project;
  }
  return identity.projects === null ? null : identity.projects[0] ?? null;
}

/**
 * Imports a base (202 + operation): the upload is streamed to a node's disk and checked there
 * entry by entry (a refused archive is 400 naming the entry, an oversize one 413, and nothing
 * is left), then unpacked by a job. The version is the first 12 hex of the upload's sha256, so
 * importing the same bytes again gives the same version (the job then only drops the upload).
 */
export async function importBase(ctx: DomainContext, identity: Identity, req: ImportRequest, data: Readable): Promise<Accepted<Base>> {
  const owner = importOwner(identity, req.project);
  await assertNameFree(ctx.db, identity, req.name, owner);
  // Before the upload is read (a second check below counts what came meanwhile).
  await assertRoomForBase(ctx.db, ctx.config.basesPerProject, owner);
  const existing = await basesRepo.anyOf(ctx.db, req.name);
  // A name's versions stay together on one node when they can (its first one's).
  // A new name goes to a node with a GB of room; a name's node is asked for one before the
  // upload is read (and for all it takes once it is in, below).
  const nodeId = existing?.node && !(await ctx.nodes.downNodes([existing.node])).has(existing.node)
    ? existing.node
    : await ctx.nodes.place(ctx.config.region, NEW_BASE);
  await ctx.nodes.assertRoom(nodeId, NEW_BASE);
  const node = await ctx.nodes.client(nodeId);
  const staged = await node.stageBaseImport(data);
  const version = staged.sha256.slice(0, 12);
  try {
    // Its node's promised storage has room for its unpacked size (507 when not), unless this
    // version is there already.
    if (!(await basesRepo.getAny(ctx.db, req.name, version))) {
      await ctx.nodes.assertRoom(nodeId, { cpus: 0, ram_mb: 0, storage_gb: Math.max(1, basesGb(staged.unpackedBytes)) });
    }
    const operation = await ctx.db.transaction(async (trx) => {
      // Its unpacked size counts from now on (the job records what it came to): the GB it adds
      // to the project's bases, rounded up over all of them (the same bytes again add nothing).
      // The project row is locked first.
      if (owner !== null && !(await basesRepo.getAny(trx, req.name, version))) {
        const owned = await basesRepo.bytesOwned(trx, owner);
        await assertQuota(ctx, trx, owner, { boxes: 0, cpus: 0, ram_mb: 0, storage_gb: basesGb(owned + staged.unpackedBytes) - basesGb(owned) });
      }
      // Again, now that the upload is in: a project may have saved under the name meanwhile.
      await basesRepo.lockName(trx, req.name);
      await assertNameFree(trx, identity, req.name, owner);
      const had = await basesRepo.getAny(trx, req.name, version);
      if (!had) {
        await assertRoomForBase(trx, ctx.config.basesPerProject, owner);
        await basesRepo.reserve(trx, { name: req.name, version, origin: 'imported', project: owner, node: nodeId, sha256: staged.sha256, created_by: identity.name, size_bytes: staged.unpackedBytes, ...provenance(req) });
      }
      return ctx.queue.enqueue(trx, baseJobs.import.of({ name: req.name, version, token: staged.token }), {
        // A project-limited importer follows its operation through one of its projects.
        resource: basePath(req.name, version), node: nodeId, project: owner ?? identity.projects?.[0], createdBy: identity.name,
      });
    });
    return { operation, load: loader(ctx, req.name, version) };
  } catch (e) {
    await node.discardStagedImport(staged.token).catch(() => undefined);
    throw e;
  }
}

/** The node that can serve a base's files: its holder, or (built-in) any node that is up. */
async function holderOf(ctx: DomainContext, row: BaseRow): Promise<NodeClient> {
  if (row.node) {
    await ctx.nodes.assertUp(row.node);
    return ctx.nodes.client(row.node);
  }
  const nodeId = await ctx.nodes.place(ctx.config.region, { cpus: 0, ram_mb: 0, storage_gb: 0 });
  return ctx.nodes.client(nodeId);
}

export async function exportBase(ctx: DomainContext, identity: Identity, spec: string): Promise<{ base: Base; data: Readable }> {
  const row = await resolveBase(ctx, identity, spec);
  if (!row) throw notFound(`base ${spec}`);
  const node = await holderOf(ctx, row);
  const ref = { name: row.name, version: row.version };
  try {
    return { base: toApiBase(row), data: await node.exportBase(ref) };
  } catch (e) {
    // A recipe base is made per node, on first use: the node asked may not have made it yet.
    if (recipeNamed(row.name) && e instanceof BoxhostError && e.code === 'not_found') {
      throw conflict(`base ${row.name}@${row.version} is not made on node ${node.nodeId} yet; make it there first (box base build ${row.name} --node ${node.nodeId}, or POST /v1/bases/${row.name}/build {"node": "${node.nodeId}"})`);
    }
    throw e;
  }
}

/**
 * Deletes `name@version`, or every version of `name` (204). 409 while any box (of any project:
 * it is named only by count) was made from one, or one is still being made; built-in bases are
 * the nodes' own. An imported base is everyone's: only a token without a project limit deletes it.
 */
export async function deleteBase(ctx: DomainContext, identity: Identity, spec: string): Promise<void> {
  const [name, version] = spec.split('@');
  const rows = (version ? [await basesRepo.getAny(ctx.db, name, version)] : await ctx.db<BaseRow>('bases').where({ name })).filter((r): r is BaseRow => r !== undefined && visible(identity, r));
  if (recipeNamed(name) && (rows.length > 0 || (await resolveBase(ctx, identity, spec)))) throw conflict(`base ${name} is built in (every node makes it); it cannot be deleted`);
  if (rows.length === 0) throw notFound(`base ${spec}`);
  if (rows.some((r) => r.origin === 'builtin')) throw conflict(`base ${name} is built in (every node makes it); it cannot be deleted`);
  if (rows.some((r) => r.project === null) && identity.projects !== null) throw forbidden(`base ${name} is shared by every project; only a token without a project limit can delete it`);
  if (rows.some((r) => r.state === 'making')) throw conflict(`base ${spec} is still being made; delete it once its operation has ended`);
  const specs = rows.map((r) => `${r.name}@${r.version}`);
  const users = await boxesRepo.countByBase(ctx.db, specs);
  if (users > 0) throw new BoxhostError('conflict', `base ${spec} is in use by ${users} box${users === 1 ? '' : 'es'}; delete ${users === 1 ? 'it' : 'them'} first`, [{ field: 'name', issue: `${users} box(es) were made from it` }]);
  for (const r of rows) {
    const node = await holderOf(ctx, r);
    await node.destroyBase({ name: r.name, version: r.version });
    await basesRepo.remove(ctx.db, r.name, r.version);
  }
}
