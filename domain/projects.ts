import type { DomainContext, Identity } from './context';
import { projectsRepo, ProjectRow } from '../db/repos/projects';
import type { Db } from '../db/knex';
import type { Project, ProjectQuotas } from '../core/apiTypes';
import { BoxhostError, notFound } from '../core/errors';
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
    usage: { boxes: u.boxes, cpus: u.cpus, ram_mb: u.ram_mb, storage_gb: u.storage_gb, volumes: 0 },
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
    const row = await projectsRepo.ensure(trx, name);
    const own: Record<string, number> = { ...(fromJson<Record<string, number>>(row.quotas) ?? {}) };
    for (const [k, v] of Object.entries(quotas)) {
      if (v === null) delete own[k];
      else if (v !== undefined) own[k] = v;
    }
    await projectsRepo.setQuotas(trx, name, own);
  });
  return show(ctx, (await projectsRepo.get(ctx.db, name))!);
}

/**
 * Refuses (429 `rate_limited`, with Retry-After) what would take a project past a quota:
 * `more` is what is about to be added. Run it inside the transaction that adds it, after
 * locking the project row, so concurrent requests are counted one after the other.
 */
export async function assertQuota(ctx: Pick<DomainContext, 'config'>, db: Db, project: string, more: { boxes: number; cpus: number; ram_mb: number; storage_gb: number }): Promise<void> {
  const row = await projectsRepo.get(db, project, { lock: true });
  const q = quotasOf(ctx, row);
  const used = await projectsRepo.usage(db, project);
  const over = (['boxes', 'cpus', 'ram_mb', 'storage_gb'] as const).filter((k) => more[k] > 0 && used[k] + more[k] > q[k]);
  if (over.length === 0) return;
  throw new BoxhostError(
    'rate_limited',
    `project ${project} is at its quota: ${over.map((k) => `${k} ${used[k]} of ${q[k]} used, ${more[k]} more asked`).join('; ')}`,
    over.map((k) => ({ field: k === 'boxes' ? 'quota.boxes' : `config.${k}`, issue: `over the project's quota of ${q[k]}` })),
    { 'Retry-After': String(QUOTA_RETRY_AFTER_S) },
  );
}
