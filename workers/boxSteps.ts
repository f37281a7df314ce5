import type { BoxRecord } from '../db/repos/boxes';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import { projectIdMap, RootSource } from '../core/box';
import type { BoxHost } from '../jobs/ports';
import type { ContainerSpec, NetworkDriver, ProjectNetwork, RuntimeDriver, StorageDriver } from './drivers';
import type { Db } from '../db/knex';

export interface BoxStepsDeps {
  db: Db;
  storage: StorageDriver;
  runtime: RuntimeDriver;
  network: NetworkDriver;
}

/**
 * The host-side steps of a box on this node, each idempotent, shared by the lifecycle jobs (as
 * their `BoxHost`) and by reconciliation: a step that already happened is a no-op the second
 * time.
 */
export class BoxSteps implements BoxHost {
  constructor(private readonly d: BoxStepsDeps) {}

  private async projectNetwork(project: string): Promise<ProjectNetwork> {
    const p = await projectsRepo.get(this.d.db, project);
    if (!p) throw new Error(`project ${project} has no network record`);
    return { index: p.net_index };
  }

  /** The root (in the project's id range) and the netns do not depend on each other: made
   *  side by side. */
  async createRoot(box: BoxRecord, source: RootSource): Promise<void> {
    const net = await this.projectNetwork(box.project);
    await Promise.all([this.d.storage.createBoxRoot(box.id, source, box.config.storage_gb, projectIdMap(net.index)), this.d.network.prepare(box.id)]);
  }

  /**
   * Starts the box's container from the stored config. The container is created in the box's
   * netns while the CNI plugins wire that netns to the project bridge: the two do not depend on
   * each other, and the box counts as started only when both are done.
   */
  async start(box: BoxRecord): Promise<void> {
    const netnsPath = await this.d.network.prepare(box.id);
    // Every await before the Promise.all: a start that fails fast must already have its handler.
    const net = await this.projectNetwork(box.project);
    const spec: ContainerSpec = {
      boxId: box.id,
      hostname: box.name,
      rootfs: this.d.storage.boxRootPath(box.id),
      netnsPath,
      cpus: box.config.cpus,
      ramMb: box.config.ram_mb,
      environment: box.environment,
      mounts: [],
      idMap: projectIdMap(net.index),
    };
    const [, attachment] = await Promise.all([this.d.runtime.start(spec), this.d.network.attach(box.id, net)]);
    if (box.address !== attachment.address) await boxesRepo.update(this.d.db, box.id, { address: attachment.address });
  }

  async stop(box: BoxRecord): Promise<void> {
    await this.d.runtime.stop(box.id, box.termination_grace_period_seconds ?? 10);
  }

  /** Removes the box's objects; the project's bridge and rules go with its last box here. */
  async destroy(box: Pick<BoxRecord, 'id' | 'project'>): Promise<void> {
    await this.d.runtime.remove(box.id);
    const p = await projectsRepo.get(this.d.db, box.project);
    if (p) {
      await this.d.network.detach(box.id, { index: p.net_index });
      await this.d.network.releaseProject({ index: p.net_index });
    }
    await this.d.storage.destroyBoxRoot(box.id);
  }
}
