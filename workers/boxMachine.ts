import type { BoxRecord } from '../db/repos/boxes';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import type { ContainerSpec, NetworkAttachment, ProjectNetwork } from './drivers';
import type { WorkerContext } from './context';

/**
 * The host-side steps of a box, each idempotent, shared by the lifecycle jobs and by
 * reconciliation: a step that already happened is a no-op the second time.
 */
async function projectNetwork(ctx: WorkerContext, project: string): Promise<ProjectNetwork> {
  const p = await projectsRepo.get(ctx.db, project);
  if (!p) throw new Error(`project ${project} has no network record`);
  return { index: p.net_index };
}

/** Joins the box to its project network (idempotent: an attached box answers its attachment). */
export const attachBox = async (ctx: WorkerContext, box: BoxRecord) => ctx.network.attach(box.id, await projectNetwork(ctx, box.project));

/** Starts the box's container from the stored config, on its network (joined here unless the
 *  caller already did it alongside other work). */
export async function startBox(ctx: WorkerContext, box: BoxRecord, attached?: NetworkAttachment): Promise<void> {
  const attachment = attached ?? (await attachBox(ctx, box));
  if (box.address !== attachment.address) await boxesRepo.update(ctx.db, box.id, { address: attachment.address });
  const rootfs = ctx.storage.boxRootPath(box.id);
  const spec: ContainerSpec = {
    boxId: box.id,
    hostname: box.name,
    rootfs,
    netnsPath: attachment.netnsPath,
    cpus: box.config.cpus,
    ramMb: box.config.ram_mb,
    environment: box.environment,
    mounts: [],
  };
  // runtime.start writes /etc/boxes-env and /etc/hostname into the stopped root itself.
  await ctx.runtime.start(spec);
}

export async function stopBox(ctx: WorkerContext, box: BoxRecord): Promise<void> {
  await ctx.runtime.stop(box.id, box.termination_grace_period_seconds ?? 10);
}

/** Everything the box holds on the host: container, network, datasets. */
export async function destroyBox(ctx: WorkerContext, box: Pick<BoxRecord, 'id' | 'project'>): Promise<void> {
  await ctx.runtime.remove(box.id);
  const p = await projectsRepo.get(ctx.db, box.project);
  if (p) await ctx.network.detach(box.id, { index: p.net_index });
  await ctx.storage.destroyBoxRoot(box.id);
}
