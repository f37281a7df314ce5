import { Readable } from 'node:stream';
import type { DomainContext, Identity } from './context';
import type { BaseBuild, BaseBuildStart, StartBaseBuildRequest } from '../core/apiTypes';
import { baseBuildsRepo, type BaseBuildRow } from '../db/repos/baseBuilds';
import { basesRepo } from '../db/repos/bases';
import { boxesRepo } from '../db/repos/boxes';
import type { OperationRow } from '../db/repos/operations';
import { BoxhostError, conflict, invalid, invalidField, notFound } from '../core/errors';
import { newId, now, sha256 } from '../core/ids';
import { BUILD_BOX_TAG } from '../core/box';
import { baseJobs } from '../jobs/baseJobs';
import { assertProject, canSeeProject } from './access';
import { resolveBase } from './baseResolve';
import { assertNameFree, assertRoomForBase, buildVersion, NEW_BASE } from './bases';
import { changeBoxState, createBox } from './boxes';
import { defaultRevision, pinnedRevision } from './packs';
import { assertQuota } from './projects';

/**
 * Base builds (docs/bases.md "Builds"): the script runs in a temporary box made from the parent
 * (a real box, in the build's project, named `build-…`), which is then saved as `base@version`
 * and deleted. The version is DESIGN.md §6's rule; a version that exists is answered at once
 * (`cached`) unless `force`.
 */

/** Where a build runs when neither the request nor the token names a project. */
export const BUILD_PROJECT = 'base-builds';
export const buildPath = (id: string) => `/v1/base-builds/${id}`;
const BUILD_ID = /^bb_[a-z0-9]{20}$/;

export const toApiBuild = (r: BaseBuildRow): BaseBuild => ({
  id: r.id,
  status: r.status,
  version: r.version,
  base: r.base,
  parent: r.parent,
  cached: Boolean(r.cached),
  error: r.error,
  created_at: r.created_at,
  updated_at: r.updated_at,
  project: r.project,
  box: r.box,
  exit_code: r.exit_code,
});

export async function getBuild(ctx: Pick<DomainContext, 'db'>, identity: Identity, id: string): Promise<BaseBuildRow> {
  const row = BUILD_ID.test(id) ? await baseBuildsRepo.get(ctx.db, id) : undefined;
  if (!row || !canSeeProject(identity, row.project)) throw notFound(`base build ${id}`);
  return row;
}

export interface BuildStarted {
  start: BaseBuildStart;
  operation: OperationRow;
}

/**
 * Starts a build (202 + operation; a cached one answers `succeeded` at once). Exactly one of
 * `pack` and the triple `base` + `parent` + `script` (else 400); the pack form takes the triple
 * from the pack's default revision (404 for a pack that is not installed).
 */
/** `packRev` (not on the route): the pack form at a stored revision, by its hash (a deploy of
 *  a revision other than the default one, domain/deploys.ts). */
export async function startBuild(ctx: DomainContext, identity: Identity, req: StartBaseBuildRequest & { packRev?: string }): Promise<BuildStarted> {
  const triple = [req.base, req.parent, req.script].filter((v) => v !== undefined && v !== null).length;
  if ((req.pack ? 1 : 0) + (triple > 0 ? 1 : 0) !== 1 || (triple > 0 && triple < 3)) {
    throw invalid('give pack, or base, parent and script together (exactly one of the two forms)', [
      { field: req.pack ? 'pack' : 'base', issue: 'exactly one of pack and the base/parent/script triple must be set' },
    ]);
  }
  // The pack form: base, parent and script of the pack's default revision (docs/packs.md); its
  // base is every project's, as the pack is.
  const form = req.pack ? (req.packRev ? await pinnedRevision(ctx, req.pack, req.packRev) : (await defaultRevision(ctx, req.pack)).spec) : { base: req.base!, parent: req.parent!, script: req.script! };
  const base = form.base;
  const script = form.script;
  if (req.project) assertProject(identity, req.project, `project ${req.project}`);
  const owner = req.pack ? null : (req.project ?? identity.projects?.[0] ?? null);
  // A pack's base is every project's: its temporary box runs in BUILD_PROJECT, out of reach of
  // a project token that starts the build (from inside the box while its script ran, one could
  // change the base every project's instances get). That token follows the build's operation
  // through its own project; the build itself only a token that reaches BUILD_PROJECT sees.
  const project = req.pack ? BUILD_PROJECT : (req.project ?? identity.projects?.[0] ?? BUILD_PROJECT);
  const builder: Identity = req.pack ? { ...identity, projects: null } : identity;
  const opProject = req.pack ? (identity.projects?.[0] ?? BUILD_PROJECT) : project;
  const parent = await resolveBase(ctx, identity, form.parent, project);
  if (!parent) throw invalidField(req.pack ? 'pack' : 'parent', `base ${form.parent}${req.pack ? ` (the parent of pack ${req.pack})` : ''} does not exist`);
  // A pack's base is every project's: it is built only from what every project sees.
  if (req.pack && parent.project !== null) throw invalidField('pack', `the parent of pack ${req.pack}, ${form.parent}, is a base of project ${parent.project}; a pack builds from a base every project sees`);
  const version = buildVersion(parent.name, parent.version, script);
  await assertNameFree(ctx.db, identity, base, owner);

  const id = newId('bb');
  const at = now();
  const row: BaseBuildRow = {
    id, status: 'queued', base, version, parent: `${parent.name}@${parent.version}`, script, cached: false, force: Boolean(req.force), project, owner,
    box_id: null, box: null, script_started: false, script_done: false, reserved: false, replaced: false, exit_code: null, error: null, log_bytes: 0, created_by: identity.name, created_at: at, updated_at: at,
  };
  const existing = await basesRepo.getAny(ctx.db, base, version);
  const running = await baseBuildsRepo.active(ctx.db, base, version);
  if (existing?.state === 'making' || running) throw conflict(`base ${base}@${version} is being made${running ? ` by build ${running.id}` : ''}; wait for it`);
  if (existing && !req.force) {
    const done = { ...row, status: 'succeeded' as const, cached: true };
    const operation = await ctx.db.transaction(async (trx) => {
      await baseBuildsRepo.insert(trx, done);
      return ctx.queue.recordDone(trx, baseJobs.build.of({ buildId: id, boxId: 'none', name: base, version }), { resource: buildPath(id), node: existing.node ?? 'local', project: opProject, createdBy: identity.name });
    });
    return { start: { id, status: 'succeeded', version, cached: true }, operation };
  }
  if (existing) {
    const users = await boxesRepo.countByBase(ctx.db, [`${base}@${version}`]);
    if (users > 0) throw new BoxhostError('conflict', `base ${base}@${version} is in use by ${users} box${users === 1 ? '' : 'es'}; a forced rebuild would replace it under them`, [{ field: 'force', issue: `${users} box(es) were made from it` }]);
  }

  // A new version asks for a GB, as a save does (docs/bases.md "Space"): of its node's
  // promised storage (507) and of its project's quota (429; the project locked before the name,
  // as an import does).
  if (!existing && parent.node) await ctx.nodes.assertRoom(parent.node, NEW_BASE);
  // The build's record and its base version first (the name is taken from now on).
  await ctx.db.transaction(async (trx) => {
    if (!existing && owner !== null) await assertQuota(ctx, trx, owner, { boxes: 0, ...NEW_BASE });
    await basesRepo.lockName(trx, base);
    await assertNameFree(trx, identity, base, owner);
    if (!existing) {
      await assertRoomForBase(trx, ctx.config.basesPerProject, owner);
      const reserved = await basesRepo.reserve(trx, {
        name: base, version, origin: 'built', project: owner, node: parent.node, sha256: null, created_by: identity.name,
        builder: 'boxhost', parent: row.parent, parent_alias: parent.name, parent_version: parent.version, script, script_sha256: sha256(script),
      });
      if (!reserved) throw conflict(`base ${base}@${version} is being made; wait for it`);
    } else if (await baseBuildsRepo.active(trx, base, version)) {
      throw conflict(`base ${base}@${version} is being built again already; wait for it`);
    }
    await baseBuildsRepo.insert(trx, { ...row, reserved: !existing });
  });
  const fail = async (why: string) => {
    await baseBuildsRepo.update(ctx.db, id, { status: 'failed', error: why });
    if (!existing) await basesRepo.dropMaking(ctx.db, base, version);
  };
  // The temporary box: a real one, made as any box is (its project's quotas and network).
  const boxName = `build-${id.slice(-8)}`;
  let boxId: string;
  try {
    const made = await createBox(ctx, builder, project, { name: boxName, base: row.parent, tags: { [BUILD_BOX_TAG]: id } });
    boxId = made.operation.box_id!;
  } catch (e) {
    await fail(`its temporary box could not be made: ${(e as Error).message}`);
    throw e;
  }
  try {
    const operation = await ctx.db.transaction(async (trx) => {
      await baseBuildsRepo.update(trx, id, { box_id: boxId, box: boxName });
      const box = (await boxesRepo.byId(trx, boxId))!;
      return ctx.queue.enqueue(trx, baseJobs.build.of({ buildId: id, boxId, name: base, version }), { resource: buildPath(id), node: box.node, project: opProject, boxId, createdBy: identity.name });
    });
    return { start: { id, status: 'queued', version, cached: false }, operation };
  } catch (e) {
    await changeBoxState(ctx, builder, project, boxName, 'delete').catch(() => undefined);
    await fail(`it could not be queued: ${(e as Error).message}`);
    throw e;
  }
}

/** The build's log so far; with `follow`, what comes next too, until the build ends. */
/** A follow ends after this long even if the build has not (the client can ask again). */
const MAX_FOLLOW_MS = 6 * 3600 * 1000;

export async function buildLog(ctx: DomainContext, identity: Identity, id: string, follow: boolean): Promise<Readable> {
  await getBuild(ctx, identity, id);
  let seq = 0;
  const until = Date.now() + MAX_FOLLOW_MS;
  // The stream is read only through the generator: once destroyed (the client went away), the
  // loop sees it at its next turn and ends, so no poll outlives its reader.
  let stream: Readable | undefined;
  async function* chunks() {
    for (;;) {
      const rows = await baseBuildsRepo.logSince(ctx.db, id, seq);
      for (const r of rows) {
        seq = r.seq;
        yield r.text;
      }
      if (!follow || stream?.destroyed || Date.now() > until) return;
      const b = await baseBuildsRepo.get(ctx.db, id);
      if (!b || b.status === 'succeeded' || b.status === 'failed') {
        // What was written between the last read and the end.
        for (const r of await baseBuildsRepo.logSince(ctx.db, id, seq)) yield r.text;
        return;
      }
      await new Promise((r) => setTimeout(r, 300));
      if (stream?.destroyed) return;
    }
  }
  stream = Readable.from(chunks());
  return stream;
}
