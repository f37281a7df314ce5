import type { DomainContext, Identity } from './context';
import { NoFreeNetIndex, projectsRepo, ProjectRow } from '../db/repos/projects';
import type { Db } from '../db/knex';
import type { Project, ProjectQuotas } from '../core/apiTypes';
import type { Config } from '../core/config';
import { BoxhostError, conflict, notFound } from '../core/errors';
import { NetLayout } from '../core/netblocks';
import { fromJson } from '../db/json';
import { assertProject, canSeeProject } from './access';

/** How long a client over quota is told to wait: a quota frees up only when boxes go. */
const QUOTA_RETRY_AFTER_S = 60;

/** A project's quotas: its own where set, else the host's defaults. */
function quotasOf(ctx: Pick<DomainContext, 'config'>, row: Pick<ProjectRow, 'quotas'> | undefined): ProjectQuotas {
  return { ...ctx.config.projectQuotas, ...(fromJson<Partial<ProjectQuotas>>(row?.quotas) ?? {}) };
}

async function show(ctx: DomainContext, row: ProjectRow): Promise<Project> {
  const u = await projectsRepo.usage(ctx.db, row.name);
  return {
    name: row.name,
    created_at: row.created_at,
    box_count: u.boxes,
    quotas: quotasOf(ctx, row),
    usage: { boxes: u.boxes, cpus: u.cpus, ram_mb: u.ram_mb, storage_gb: u.storage_gb, volumes: u.volumes },
  };
}

/** Projects the caller may see, with their box counts, quotas and usage. */
export async function listProjects(ctx: DomainContext, identity: Identity): Promise<Project[]> {
  const rows = (await projectsRepo.list(ctx.db)).filter((p) => canSeeProject(identity, p.name));
  return Promise.all(rows.map((r) => show(ctx, r)));
}

export async function getProject(ctx: DomainContext, identity: Identity, name: string): Promise<Project> {
  assertProject(identity, name, `project ${name}`);
  const row = await projectsRepo.get(ctx.db, name);
  if (!row) throw notFound(`project ${name}`);
  return show(ctx, row);
}

/** Sets a project's own quotas (null: back to the default); makes the project if it is new, so
 *  quotas can be set before its first box. */
export async function setProjectQuotas(ctx: DomainContext, name: string, quotas: Partial<Record<keyof ProjectQuotas, number | null>>): Promise<Project> {
  await ctx.db.transaction(async (trx) => {
    const row = await ensureProject(ctx, trx, name);
    const own: Record<string, number> = { ...(fromJson<Record<string, number>>(row.quotas) ?? {}) };
    for (const [k, v] of Object.entries(quotas)) {
      if (v === null) delete own[k];
      else if (v !== undefined) own[k] = v;
    }
    await projectsRepo.setQuotas(trx, name, own);
  });
  return show(ctx, (await projectsRepo.get(ctx.db, name))!);
}

/** The project's row locked in the transaction `db` (FOR UPDATE on Postgres): read so, or
 *  handed in by a caller that read it so (`ensureProject(…, { lock: true })`). */
async function lockedRow(db: Db, projectOrRow: string | ProjectRow): Promise<[string, ProjectRow | undefined]> {
  if (typeof projectOrRow !== 'string') return [projectOrRow.name, projectOrRow];
  return [projectOrRow, await projectsRepo.get(db, projectOrRow, { lock: true })];
}

/**
 * Refuses (429 `rate_limited`, with Retry-After) what would take a project past a quota:
 * `more` is what is about to be added. Run it inside the transaction that adds it, after
 * locking the project row, so concurrent requests are counted one after the other.
 */
export async function assertQuota(ctx: Pick<DomainContext, 'config'>, db: Db, projectOrRow: string | ProjectRow, more: { boxes: number; cpus: number; ram_mb: number; storage_gb: number; volumes?: number }): Promise<void> {
  const [project, row] = await lockedRow(db, projectOrRow);
  const q = quotasOf(ctx, row);
  const used = await projectsRepo.usage(db, project);
  const over = (['boxes', 'cpus', 'ram_mb', 'storage_gb', 'volumes'] as const).filter((k) => (more[k] ?? 0) > 0 && used[k] + (more[k] ?? 0) > q[k]);
  if (over.length === 0) return;
  throw new BoxhostError(
    'rate_limited',
    `project ${project} is at its quota: ${over.map((k) => `${k} ${used[k]} of ${q[k]} used, ${more[k] ?? 0} more asked`).join('; ')}`,
    over.map((k) => ({ field: k === 'boxes' || k === 'volumes' ? `quota.${k}` : `config.${k}`, issue: `over the project's quota of ${q[k]}` })),
    { 'Retry-After': String(QUOTA_RETRY_AFTER_S) },
  );
}

// ------------------------------------------------------------------ network room (docs/decisions.md "Network")

const layouts = new WeakMap<Config, NetLayout>();

/** The box network layout of the installation: every node is set up with the same one (a
 *  project's index names the same block on each). */
export function layoutOf(ctx: Pick<DomainContext, 'config'>): NetLayout {
  let l = layouts.get(ctx.config);
  if (!l) layouts.set(ctx.config, (l = new NetLayout(ctx.config.boxSubnet, ctx.config.projectPrefix)));
  return l;
}

/** The project's row, made with its network index when it is new; 409 when the layout has no
 *  index left (a project keeps its block for good). `lock`: read FOR UPDATE (Postgres), for a
 *  transaction that hands the row on to `assertQuota` and `assertAddressRoom`. */
export async function ensureProject(ctx: Pick<DomainContext, 'config'>, db: Db, name: string, opts: { lock?: boolean } = {}): Promise<ProjectRow> {
  const layout = layoutOf(ctx);
  try {
    return await projectsRepo.ensure(db, name, layout.maxProjects, opts);
  } catch (e) {
    if (!(e instanceof NoFreeNetIndex)) throw e;
    const wider = layout.widened();
    throw conflict(
      `no network is left for a new project ${name}: BOXHOST_BOX_SUBNET=${layout.subnet} holds ${layout.maxProjects} projects of /${layout.projectPrefix} ` +
        `(BOXHOST_PROJECT_PREFIX=${layout.projectPrefix}) and all exist; widen BOXHOST_BOX_SUBNET from its first address${wider ? ` (${wider} holds twice as many)` : ''} ` +
        `on the api and every node, or use a longer BOXHOST_PROJECT_PREFIX (fewer boxes per project; only on nodes that hold no boxes)`,
    );
  }
}

/** Why the project cannot have one more box on `node` (every address of its block there is
 *  held), or null when it can. `held`: its box rows on that node. */
function noAddress(layout: NetLayout, row: Pick<ProjectRow, 'name' | 'net_index'>, node: string, held: number): string | null {
  if (!layout.has(row.net_index)) {
    return `project ${row.name} has network index ${row.net_index}, outside ${layout.describe()} (${layout.maxProjects} projects): ` +
      'this installation was set up with another layout; set those variables back to it';
  }
  if (held < layout.boxesPerProject) return null;
  return `project ${row.name} has no free address on node ${node}: its network ${layout.block(row.net_index).cidr} holds ${layout.boxesPerProject} boxes ` +
    `(BOXHOST_PROJECT_PREFIX=${layout.projectPrefix}); delete boxes of the project there, or widen the project prefix (on a node that holds no boxes)`;
}

/** Node id → why the project has no address left there, for placement to go elsewhere (a
 *  project new to the installation has room everywhere). */
export async function nodesWithoutAddress(ctx: Pick<DomainContext, 'config' | 'db'>, project: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const row = await projectsRepo.get(ctx.db, project);
  if (!row) return out;
  for (const [node, held] of await projectsRepo.boxesByNode(ctx.db, project)) {
    const why = noAddress(layoutOf(ctx), row, node, held);
    if (why) out.set(node, why);
  }
  return out;
}

/**
 * 409 unless the project has an address left on `node` for one more box: its box rows there
 * (any status) against the addresses of its block. Run it inside the transaction that inserts
 * the box, after the project row is locked (`assertQuota`), so two creates at the edge are
 * counted one after the other.
 */
export async function assertAddressRoom(ctx: Pick<DomainContext, 'config'>, db: Db, projectOrRow: string | ProjectRow, node: string): Promise<void> {
  const [project, row] = await lockedRow(db, projectOrRow);
  if (!row) return;
  const why = noAddress(layoutOf(ctx), row, node, (await projectsRepo.boxesByNode(db, project)).get(node) ?? 0);
  if (why) throw conflict(why);
}
