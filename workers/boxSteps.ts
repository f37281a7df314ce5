import { refreshLinkedEnv } from '../jobs/outputs';
import type { BoxRecord } from '../db/repos/boxes';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import { IdMap, MAX_STOP_GRACE_SECS, projectIdMap, RootSource } from '../core/box';
import type { BoxHost } from '../jobs/ports';
import type { ServiceStartRequest } from '../core/apiTypes';
import { checkStart, specOf } from '../core/services';
import { startService } from './agent/localServices';
import { contractError } from './agent/localNode';
import type { ContainerSpec, NetworkDriver, ProjectNetwork, RuntimeDriver, StorageDriver, VolumeDriver } from './drivers';
import { volumesRepo } from '../db/repos/volumes';
import type { Db } from '../db/knex';
import { RecipeBases } from './bases/recipeBases';
import { allSettledOrThrow } from '../core/promises';

interface StartOptions {
  recordAddress?: boolean;
  rootReady?: Promise<void>;
  rootMade?: Promise<void>;
  netnsReady?: Promise<void>;
}

/** A create whose box was deleted (or otherwise moved on) while its root was made. */
class NotWanted extends Error {}
const noop = () => undefined;

/** Test-only seam (test/boxes-crash.test.ts): the process dies at the step point BOXHOST_TEST_CRASH_AT names; unset, nothing. */
const crashPoint = (point: string) => void (process.env.BOXHOST_TEST_CRASH_AT === point && process.kill(process.pid, 'SIGKILL'));

export interface BoxStepsDeps {
  db: Db;
  /** The ZFS driver also readies roots made before user namespaces (the mock needs not). */
  storage: StorageDriver;
  /** runc also makes each box's netns inside the box's user namespace (the mock needs not). */
  runtime: RuntimeDriver;
  network: NetworkDriver;
  /** Data volumes attached to a box are bound into it at its start. */
  volumes: VolumeDriver;
  /** Recipe bases (`debian`) are made on the node by the first create that needs them. */
  recipes?: Pick<RecipeBases, 'ensure'>;
  /** The publish proxy's port, for `{{url.*}}` outputs rendered at a start (jobs/outputs.ts). */
  proxyPort?: number;
}

/**
 * The host-side steps of a box on this node, each idempotent, shared by the lifecycle jobs (as
 * their `BoxHost`) and by reconciliation: a step that already happened is a no-op the second
 * time.
 */
export class BoxSteps implements BoxHost {
  /** project → its network index (`projectNetwork`). */
  private readonly netIndexes = new Map<string, number>();

  constructor(private readonly d: BoxStepsDeps) {}

  /** A project keeps its network index for good (projects are never deleted, and the index is
   *  set once, when its row is made): read once per process. */
  private async projectNetwork(project: string): Promise<ProjectNetwork> {
    let index = this.netIndexes.get(project);
    if (index === undefined) {
      const p = await projectsRepo.get(this.d.db, project);
      if (!p) throw new Error(`project ${project} has no network record`);
      this.netIndexes.set(project, (index = p.net_index));
    }
    return { index };
  }

  /** The root (in the project's id range) and the netns (in the box's user namespace) do not
   *  depend on each other: made side by side. */
  async createRoot(box: BoxRecord, source: RootSource): Promise<void> {
    const { made } = await this.makeRoot(box, source);
    await made;
  }

  /**
   * A create: the root and the netns made (as createRoot), then the box started. What the start
   * needs no root for (its lookups, the container's bundle) is done while the root is cloned;
   * `stillWanted` is asked once the root is there (a delete may have come meanwhile), and when
   * it says no nothing is started: null.
   */
  async create(box: BoxRecord, source: RootSource, stillWanted: () => Promise<boolean>): Promise<string | null> {
    const { made, netns } = await this.makeRoot(box, source);
    const wanted = made.then(stillWanted).then((yes) => {
      if (!yes) throw new NotWanted();
    });
    wanted.catch(noop); // its failure is the start's to throw, once it is looked at
    try {
      return await this.startBox(box, { recordAddress: false, rootReady: wanted, rootMade: made, netnsReady: netns });
    } catch (e) {
      if (e instanceof NotWanted) return null;
      throw e;
    }
  }

  /** The clone and the netns under way (`made`: both, then the crash point after them); the
   *  recipe base a first box of it needs is made before either. */
  private async makeRoot(box: BoxRecord, source: RootSource): Promise<{ made: Promise<void>; netns: Promise<void> }> {
    crashPoint('createRoot');
    const net = await this.projectNetwork(box.project);
    const idMap = projectIdMap(net.index);
    // The first box from `debian` on this node waits while it is made (minutes, once).
    if (source.kind === 'base' && this.d.recipes && RecipeBases.isRecipe(source.base)) await this.d.recipes.ensure(source.base);
    const netns = (async () => {
      // Made by the runtime, in the box's user namespace, where the network driver keeps it.
      const netnsPath = this.d.network.netnsPath(box.id);
      if (!(await this.d.runtime.ownsNetns(box.id, netnsPath))) await this.d.runtime.makeNetns(box.id, netnsPath, idMap);
      await this.d.network.prepare(box.id); // there now: only makes sure
    })();
    const root = this.d.storage.createBoxRoot(box.id, source, box.config.storage_gb, idMap);
    const made = allSettledOrThrow([root, netns] as const).then(() => crashPoint('createRoot:done'));
    return { made, netns };
  }

  /**
   * Starts the box's container from the stored config. The container is created in the box's
   * netns while the CNI plugins wire that netns to the project bridge: the two do not depend on
   * each other, and the box counts as started only when both are done.
   */
  start(box: BoxRecord, opts: { recordAddress?: boolean } = {}): Promise<string> {
    return this.startBox(box, opts);
  }

  /** `start`, with a create's root (`rootReady`) and netns (`netnsReady`) still being made: the
   *  netns is looked at once made, and nothing is run or wired before the root is there. A
   *  failure is thrown once the root's making has settled too (nothing of the create goes on
   *  behind it, for the cleanup to miss). `rootMade` (the clone alone, before `rootReady`'s
   *  last checks) lets the root be readied for the container while those go on. */
  private async startBox(box: BoxRecord, opts: StartOptions): Promise<string> {
    try {
      return await this.startNow(box, opts);
    } catch (e) {
      await opts.rootReady?.catch(noop);
      throw e;
    }
  }

  private async startNow(box: BoxRecord, opts: StartOptions): Promise<string> {
    // The root there and (a create's) still wanted; `opts.rootMade`: there, the clone alone.
    const rootWanted = opts.rootReady ?? Promise.resolve();
    // Every await before the last Promise.all: a start that fails fast must already have its handler.
    const net = await this.projectNetwork(box.project);
    const idMap = projectIdMap(net.index);
    // The netns (files), the volumes and the outputs it takes from other instances (env_from),
    // as they are now (the db): looked up side by side, and all settled before a failure of one
    // is thrown (a netns being remade is never left half-way for a retry to overlap).
    const [{ netnsPath, loopbackUp }, volumes, environment] = await allSettledOrThrow([
      (async () => {
        await opts.netnsReady;
        return this.boxNetns(box.id, net, idMap);
      })(),
      this.volumeMounts(box),
      refreshLinkedEnv(this.d.db, box, { proxyPort: this.d.proxyPort ?? 0 }),
    ] as const);
    // The root is readied for the container (a root of an older version shifted into the
    // range, its mount made nosuid,nodev, the volumes' likewise) while the runtime writes the
    // container's bundle.
    const prepared = (async () => {
      await (opts.rootMade ?? rootWanted);
      await Promise.all(volumes.map((m) => this.d.volumes.prepareVolume(m.volumeId, idMap)));
      return this.d.storage.prepareBoxRoot(box.id, idMap);
    })();
    // A box no longer wanted is that, whatever its readying met meanwhile.
    const rootReady = allSettledOrThrow([rootWanted, prepared] as const).then(([, real]) => real);
    rootReady.catch(noop); // the runtime's start throws it
    const spec: ContainerSpec = {
      boxId: box.id,
      hostname: box.name,
      rootfs: this.d.storage.boxRootPath(box.id),
      netnsPath,
      cpus: box.config.cpus,
      ramMb: box.config.ram_mb,
      environment,
      mounts: volumes.map(({ source, destination, readOnly }) => ({ source, destination, readOnly })),
      idMap,
      rootReady,
      // A create's root is mounted where its clone puts it: the bundle is written meanwhile.
      expectedRootfs: opts.rootMade ? this.d.storage.boxRootMount(box.id, idMap) : undefined,
    };
    const started = (async () => {
      await this.d.runtime.start(spec);
      crashPoint('start:container'); // the network may be half wired beside it
    })();
    // Wired once the root is there (a create's root that failed leaves no lease behind).
    const attached = rootWanted.then(() => this.d.network.attach(box.id, net, { loopbackUp }));
    // The root's readying too: the runtime's start may fail before it waits for it.
    const [, attachment] = await allSettledOrThrow([started, attached, rootReady] as const);
    if (opts.recordAddress !== false && box.address !== attachment.address) await boxesRepo.update(this.d.db, box.id, { address: attachment.address });
    crashPoint('start:done');
    return attachment.address;
  }

  /** The box's data volumes as bind mounts (docs/data.md: attach and detach act at the next
   *  start). The attachment rows are the truth: a mount whose volume is gone is left out. */
  private async volumeMounts(box: BoxRecord): Promise<(ContainerSpec['mounts'][number] & { volumeId: string })[]> {
    await volumesRepo.dropDetached(this.d.db, box.id);
    if (box.data_mounts.length === 0) return [];
    // Marked, then only the marked read: a row attached between the two waits for the next start
    // (bound in now, it would count as never mounted and a detach would free it under the box).
    await volumesRepo.markMounted(this.d.db, box.id);
    const rows = await volumesRepo.mountedOfBox(this.d.db, box.id);
    for (const r of rows) {
      // A restore swaps the dataset: the box waits for it (its job retries) rather than mount
      // one that is about to be replaced.
      const vol = await volumesRepo.byId(this.d.db, r.volume_id);
      if (vol?.state === 'restoring') throw new Error(`data volume ${vol.name} is being restored; the box starts once that is done`);
    }
    return rows
      .sort((a, b) => a.path.localeCompare(b.path))
      .map((a) => ({ volumeId: a.volume_id, source: this.d.volumes.volumePath(a.volume_id), destination: a.path, readOnly: Boolean(a.read_only) }));
  }

  /**
   * The box's netns, owned by its user namespace, before anything wires it. A netns that is not
   * (made before user namespaces, or made again by `ip netns add` after a reboot) may still
   * hold the box's address: it is detached first, so the address is free for the new one.
   */
  private async boxNetns(boxId: string, net: ProjectNetwork, idMap: IdMap): Promise<{ netnsPath: string; loopbackUp: boolean }> {
    const netnsPath = await this.d.network.prepare(boxId);
    if (await this.d.runtime.ownsNetns(boxId, netnsPath)) return { netnsPath, loopbackUp: await this.d.runtime.netnsLoopbackUp(boxId, netnsPath) };
    await this.d.network.detach(boxId, net);
    const fresh = await this.d.network.prepare(boxId);
    await this.d.runtime.makeNetns(boxId, fresh, idMap);
    return { netnsPath: fresh, loopbackUp: true };
  }

  hasRoot(box: BoxRecord): Promise<boolean> {
    return this.d.storage.hasBoxRoot(box.id);
  }

  /** The grace is capped (the box schemas refuse more; rows from before the cap may hold up to 3600 s). */
  async stop(box: BoxRecord): Promise<void> {
    await this.d.runtime.stop(box.id, Math.min(box.termination_grace_period_seconds ?? 10, MAX_STOP_GRACE_SECS));
    // Volumes detached while it ran are no longer mounted anywhere.
    await volumesRepo.dropDetached(this.d.db, box.id);
  }

  async snapshot(box: BoxRecord, name: string, description?: string): Promise<void> {
    try {
      // Inside the try: a pause that froze the box and then failed is thawed too.
      await this.d.runtime.pause(box.id);
      crashPoint('snapshot:paused');
      await this.d.storage.snapshotBoxRoot(box.id, name, description);
    } finally {
      await this.d.runtime.unpause(box.id);
    }
  }

  restoreBlockers(box: BoxRecord, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }> {
    return this.d.storage.rollbackBlockers(box.id, snapshot);
  }

  /** Each step is one a retry can take again: a stopped container stays stopped, a root rolled
   *  back rolls back to the same snapshot, a running box is left running. */
  async restore(box: BoxRecord, snapshot: string): Promise<void> {
    await this.stop(box);
    crashPoint('restore:stopped');
    await this.d.storage.rollbackBoxRoot(box.id, snapshot);
    await this.start(box);
  }

  /** Removes the box's objects; the project's bridge and rules go with its last box here. */
  async destroy(box: Pick<BoxRecord, 'id' | 'project'>): Promise<void> {
    crashPoint('destroy');
    await this.d.runtime.remove(box.id);
    crashPoint('destroy:container');
    const p = await projectsRepo.get(this.d.db, box.project);
    if (p) {
      await this.d.network.detach(box.id, { index: p.net_index });
      await this.d.network.releaseProject({ index: p.net_index });
    }
    crashPoint('destroy:network');
    await this.d.storage.destroyBoxRoot(box.id);
    crashPoint('destroy:done');
  }

  /** A pack instance's service (jobs/packServices.ts): the route's rules, then boxd starts it
   *  and its gate is looked at from inside the box (workers/agent/localServices.ts). */
  async startService(box: BoxRecord, req: ServiceStartRequest): Promise<void> {
    const gate = checkStart(req);
    try {
      await startService(await this.d.runtime.services(box.id), specOf(req), gate);
    } catch (e) {
      // What the route would answer (a user or cwd the box lacks: 400, nothing retried).
      throw contractError(e);
    }
  }
}
