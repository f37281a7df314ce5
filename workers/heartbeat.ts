import os from 'node:os';
import type { Db } from '../db/knex';
import type { Logger } from '../core/logger';
import { NodeRegistration, nodesRepo } from '../db/repos/nodes';
import type { LocalNode } from './agent/localNode';

export interface Heartbeat {
  /** A beat now (after the one under way, if any): for a change of the node's storage that
   *  placement must see before the next scheduled beat, such as the end of a storage recovery. */
  beat(): Promise<void>;
  stop(): Promise<void>;
}

/** What a node says of itself when it registers: the machine's cpus and RAM (or the
 *  configured overrides) and what its pool can hold. */
export async function describeNode(opts: {
  id: string;
  name?: string;
  region: string;
  agentUrl: string | null;
  version: string;
  cpus?: number;
  ramMb?: number;
  diskBytes: number;
  /** StorageDriver.rootLimit: box roots the storage can hold (null: no limit of its own). */
  rootLimit?: number | null;
  overcommit: { cpu: number; ram: number; storage: number };
}): Promise<NodeRegistration> {
  const cpus = opts.cpus ?? os.cpus().length;
  const ramMb = opts.ramMb ?? Math.floor(os.totalmem() / 1024 / 1024);
  const diskGb = Math.floor(opts.diskBytes / 1024 ** 3);
  return {
    id: opts.id,
    name: opts.name ?? os.hostname(),
    region: opts.region,
    agent_url: opts.agentUrl,
    cpus,
    ram_mb: ramMb,
    disk_gb: diskGb,
    // What boxes may be promised in all (docs/security.md "Admission").
    alloc_cpus: Math.floor(cpus * opts.overcommit.cpu),
    alloc_ram_mb: Math.floor(ramMb * opts.overcommit.ram),
    alloc_disk_gb: Math.floor(diskGb * opts.overcommit.storage),
    // Mounts are not overcommitted: a root past the limit cannot be mounted at all.
    alloc_boxes: opts.rootLimit ?? null,
    version: opts.version,
  };
}

/**
 * Registers the node and keeps its heartbeat fresh: every `intervalMs` it writes the time and
 * what its storage says. The api counts the node down once the heartbeat is older than
 * BOXHOST_NODE_TIMEOUT_SECS; a node that stops cleanly signs off at once.
 */
export async function startHeartbeat(
  db: Db,
  node: LocalNode,
  registration: NodeRegistration,
  intervalMs: number,
  log: Logger,
  rootLimit?: () => Promise<number | null>,
): Promise<Heartbeat> {
  await nodesRepo.register(db, registration);
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let beat: Promise<void> = Promise.resolve();
  const tick = async () => {
    try {
      const storage = await node.storageHealth();
      // Other hosts' mounts come and go on the machine: the limit is read again each beat.
      const allocBoxes = rootLimit ? await rootLimit().catch(() => undefined) : undefined;
      // No row: an admin forgot this node while it was hung. It is alive: register again.
      if (!stopped && (await nodesRepo.heartbeat(db, registration.id, storage, allocBoxes)) === 0) await nodesRepo.register(db, { ...registration, alloc_boxes: allocBoxes ?? registration.alloc_boxes });
    } catch (e) {
      log.warn({ err: (e as Error).message }, 'heartbeat not written');
    }
  };
  // One beat at a time (stop() waits for the last of the chain), the next scheduled one
  // `intervalMs` after the last one ended.
  const beatNow = () => (beat = beat.then(() => (stopped ? undefined : tick())));
  const schedule = () => {
    timer = setTimeout(() => {
      void beatNow().then(() => {
        if (!stopped) schedule();
      });
    }, intervalMs);
    timer.unref();
  };
  schedule();
  return {
    beat: beatNow,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await beat;
      await nodesRepo.signOff(db, registration.id).catch((e) => log.warn({ err: (e as Error).message }, 'sign-off not written'));
    },
  };
}
