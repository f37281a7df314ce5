import type { DomainContext, Identity } from './context';
import type { Box } from '../core/apiTypes';
import { assertProject } from './access';
import { BoxhostError, invalidField } from '../core/errors';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { packsRepo } from '../db/repos/packs';
import { basesRepo } from '../db/repos/bases';
import { baseBuildsRepo } from '../db/repos/baseBuilds';
import type { Accepted } from './operations';
import { createBox, type CreateBoxRequest, type InstanceOf } from './boxes';
import type { PackRevisionSpec } from '../core/apiTypes';
import { resolveBase } from './baseResolve';
import { buildVersion } from './bases';
import { startBuild } from './baseBuilds';
import { defaultRevision } from './packs';
import { linkedName, outputsOf, resolveInstance } from '../jobs/outputs';
import type { EnvLinkRow } from '../db/repos/outputs';
import { checkPublishName } from '../core/services';

/**
 * Box create with `pack`, `lifecycle` and `env_from` (docs/packs.md "Instances"): the spec's
 * rules (lifecycle only `dev`, only with pack; env_from only from instances), then the pack's
 * default revision gives the base (`<base>@<version>` of the build rule) and the box records
 * `pack` and `pack_rev` (the revision's hash). A base not built yet is built now with the pack
 * form of base builds; the instance is made on the build's node and its create waits for it
 * (202 as any create; the build failing fails the create).
 */
export async function createBoxOrInstance(ctx: DomainContext, identity: Identity, project: string, req: CreateBoxRequest): Promise<Accepted<Box>> {
  // Before anything of the project is looked at (env_from boxes) or started (a pack's build).
  assertProject(identity, project, `project ${project}`);
  if (req.lifecycle !== undefined && req.lifecycle !== null) {
    if (req.lifecycle !== 'dev') throw invalidField('lifecycle', 'only dev is accepted; deploy instances are set internally');
    if (!req.pack) throw invalidField('lifecycle', 'lifecycle needs pack');
  }
  const linked = await outputsFrom(ctx, project, req.env_from ?? [], req.environment ?? {});
  const environment = { ...linked.env, ...(req.environment ?? {}) };
  const plain = { ...req, environment, pack: undefined, lifecycle: undefined, env_from: undefined, envLinks: linked.links };
  if (!req.pack) return createBox(ctx, identity, project, plain);
  if (req.base) throw invalidField('base', 'an instance is made from its pack\'s base: give pack or base, not both');
  if (req.fork) throw invalidField('fork', 'an instance is made from its pack\'s base: give pack or fork, not both');
  if (!(await packsRepo.get(ctx.db, req.pack))) throw invalidField('pack', `pack ${req.pack} is not installed`);
  const revision = await defaultRevision(ctx, req.pack);
  return createInstance(ctx, identity, project, plain, req.pack, revision, { lifecycle: req.lifecycle === 'dev' ? 'dev' : null });
}

/**
 * An instance of `pack` at one revision: its base (`<base>@<version>` of the build rule) built
 * first when it is not; `extra` says the lifecycle and, for a deploy generation, what follows
 * the create instead of the services job (domain/deploys.ts).
 */
export async function createInstance(
  ctx: DomainContext, identity: Identity, project: string, plain: CreateBoxRequest, pack: string,
  { rev, spec }: { rev: string; spec: PackRevisionSpec }, extra: Pick<InstanceOf, 'lifecycle' | 'rollbackTo' | 'followUp'>,
): Promise<Accepted<Box>> {
  const parent = await resolveBase(ctx, identity, spec.parent, project);
  if (!parent) throw invalidField('pack', `base ${spec.parent}, the parent of pack ${pack}, does not exist`);
  const version = buildVersion(parent.name, parent.version, spec.script);
  const services = spec.services ?? [];
  // A deploy generation takes the line's publishes when it is switched to, not at its create.
  const publishes = extra.followUp ? [] : services.filter((s) => s.publish).map((s) => ({ name: checkPublishName(s.publish!.name ?? s.name, 'pack'), port: s.port!, public: s.publish!.public, force: true, service: s.name, who: identity.name }));
  // The services' rules were checked when the pack was installed (domain/packs.ts).
  const instance: InstanceOf = { pack, pack_rev: rev, services: services.length > 0, publishes, ...extra };
  const base = { ...plain, base: `${spec.base}@${version}` };
  const built = await basesRepo.getAny(ctx.db, spec.base, version);
  if (built?.state === 'ready') return createBox(ctx, identity, project, base, instance);
  // Not built yet: built now (or by the build under way), on the node the instance then goes to;
  // its create job waits for the base (jobs/boxCreate.ts).
  if (!built) {
    const started = await startBuild(ctx, identity, { pack, packRev: rev });
    if (started.start.status === 'succeeded') return createBox(ctx, identity, project, base, instance);
  }
  const node = await buildNode(ctx, spec.base, version);
  if (!node) {
    throw new BoxhostError('conflict', `the base of pack ${pack} (${spec.base}@${version}) is being made; create the instance again in a moment`, [{ field: 'pack', issue: `base ${spec.base}@${version} is not built yet` }]);
  }
  return createBox(ctx, identity, project, base, { ...instance, pendingBase: { name: spec.base, version, node } });
}

/** The node where base@version is being built (its temporary box's). */
async function buildNode(ctx: DomainContext, base: string, version: string): Promise<string | undefined> {
  const build = await baseBuildsRepo.active(ctx.db, base, version);
  const box = build?.box_id ? await boxesRepo.byId(ctx.db, build.box_id) : undefined;
  return box?.node;
}

/**
 * `env_from`: each named box (same project; a deploy line's name means its live generation)
 * must be a pack instance; its revision's outputs, rendered over that instance
 * (jobs/outputs.ts), become `<ALIAS>_<KEY>` variables. The links are kept with the box, which
 * renders them again at each start (docs/packs.md "Outputs and env_from"); a variable the
 * request's own `environment` sets is the box's, never overwritten.
 */
async function outputsFrom(ctx: DomainContext, project: string, from: { alias: string; box: string }[], own: Record<string, string>): Promise<{ env: Record<string, string>; links: Omit<EnvLinkRow, 'box_id'>[] }> {
  const env: Record<string, string> = {};
  const links: Omit<EnvLinkRow, 'box_id'>[] = [];
  // Two aliases whose variables could collide (the same, or one a prefix of the other at an
  // underscore: `a` with key B_C and `a_b` with key C) would take each other's values.
  const upper = from.map((e) => e.alias.toUpperCase());
  for (const [i, a] of upper.entries()) {
    const other = upper.findIndex((b, j) => j !== i && (b === a || b.startsWith(`${a}_`)));
    if (other >= 0) throw invalidField(`env_from.${Math.max(i, other)}.alias`, `aliases ${from[i].alias} and ${from[other].alias} could name the same variables`);
  }
  // The box's own variables are its own for good: a source that gains such an output later does
  // not overwrite them.
  const ownKeys = Object.keys(own);
  for (const [i, e] of from.entries()) {
    const src = await resolveInstance(ctx.db, project, e.box);
    if (!src) throw invalidField(`env_from.${i}.box`, `box ${project}/${e.box} does not exist`);
    const outputs = await outputsOf(ctx.db, src, ctx.config);
    if (!outputs) throw invalidField(`env_from.${i}.box`, `box ${e.box} is not a pack instance`);
    const keys: string[] = [];
    for (const [key, value] of Object.entries(outputs)) {
      const name = linkedName(e.alias, key);
      if (Object.hasOwn(own, name)) continue;
      env[name] = value;
      keys.push(name);
    }
    const prefix = linkedName(e.alias, '');
    links.push({ position: i, alias: e.alias, source: e.box, keys: JSON.stringify(keys), own: JSON.stringify(ownKeys.filter((k) => k.startsWith(prefix))) });
  }
  return { env, links };
}
