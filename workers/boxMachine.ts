import type { BoxRecord } from '../db/repos/boxes';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import type { ContainerSpec, ProjectNetwork } from './drivers';
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

/**
 * Starts the box's container from the stored config. The container is created in the box's
 * netns while the CNI plugins wire that netns to the project bridge: the two do not depend on
 * each other, and the box counts as started only when both are done.
 */
export async function startBox(ctx: WorkerContext, box: BoxRecord): Promise<void> {
  const netnsPath = await ctx.network.prepare(box.id);
  const spec: ContainerSpec = {
    boxId: box.id,
    hostname: box.name,
    rootfs: ctx.storage.boxRootPath(box.id),
    netnsPath,
    cpus: box.config.cpus,
    ramMb: box.config.ram_mb,
    environment: box.environment,
    mounts: [],
  };
  // runtime.start writes /etc/boxes-env and /etc/hostname into the stopped root itself.
  const [, attachment] = await Promise.all([ctx.runtime.start(spec), ctx.network.attach(box.id, await projectNetwork(ctx, box.project))]);
  if (box.address !== attachment.address) await boxesRepo.update(ctx.db, box.id, { address: attachment.address });
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
