import type { Db } from '../knex';
import { now } from '../../core/ids';
import { basesGb, boxConfigSums, configSumsOf } from '../json';

export type NodeState = 'active' | 'draining';

export interface NodeRow {
  id: string;
  name: string;
  region: string;
  agent_url: string | null;
  state: NodeState;
  cpus: number;
  ram_mb: number;
  disk_gb: number;
  /** What boxes may be promised in all: capacity × the node's overcommit (null: unlimited,
   *  a node of an older version). */
  alloc_cpus: number | null;
  alloc_ram_mb: number | null;
  alloc_disk_gb: number | null;
  /** How many box roots its storage can hold mounted in all (null: no such limit; zfs-fuse
   *  mounts at most 1000 filesystems machine-wide, fewer with a small ARC). Refreshed with
   *  every heartbeat. */
  alloc_boxes: number | null;
  version: string;
  started_at: string;
  heartbeat_at: string | null;
  storage: string;
  /** Times this node's storage watchdog restarted its storage, and when it last did. */
  storage_restarts: number;
  storage_restarted_at: string | null;
  created_at: string;
  updated_at: string;
}

/** What the boxes placed on a node have been promised (every box row counts, stopped ones
 *  too: a resume must find its room). */
export interface Committed {
  cpus: number;
  ram_mb: number;
  disk_gb: number;
  boxes: number;
}

export type NodeRegistration = Pick<NodeRow, 'id' | 'name' | 'region' | 'agent_url' | 'cpus' | 'ram_mb' | 'disk_gb' | 'alloc_cpus' | 'alloc_ram_mb' | 'alloc_disk_gb' | 'version'> &
  Partial<Pick<NodeRow, 'alloc_boxes'>>;

export const nodesRepo = {
  get: (db: Db, id: string) => db<NodeRow>('nodes').where({ id }).first(),
  list: (db: Db) => db<NodeRow>('nodes').orderBy('id'),
  /** A node says it is up: its row is made or refreshed; `state` (set by an admin) is kept. */
  async register(db: Db, n: NodeRegistration): Promise<void> {
    const at = now();
    await db<NodeRow>('nodes')
      .insert({ alloc_boxes: null, ...n, state: 'active', started_at: at, heartbeat_at: at, storage: 'ok', created_at: at, updated_at: at })
      .onConflict('id')
      .merge(['name', 'region', 'agent_url', 'cpus', 'ram_mb', 'disk_gb', 'alloc_cpus', 'alloc_ram_mb', 'alloc_disk_gb', 'alloc_boxes', 'version', 'started_at', 'heartbeat_at', 'storage', 'updated_at']);
  },
  /** `allocBoxes`: the node's root limit as its storage says now (undefined: unchanged). */
  heartbeat: (db: Db, id: string, storage: string, allocBoxes?: number | null) =>
    db<NodeRow>('nodes').where({ id }).update({ heartbeat_at: now(), storage, ...(allocBoxes === undefined ? {} : { alloc_boxes: allocBoxes }) }),
  /** A node that stops cleanly says so at once, instead of letting its heartbeat age. */
  signOff: (db: Db, id: string) => db<NodeRow>('nodes').where({ id }).update({ heartbeat_at: null, updated_at: now() }),
  /** The storage watchdog brought the node's storage back once more. */
  storageRestarted: (db: Db, id: string) =>
    db<NodeRow>('nodes').where({ id }).update({ storage_restarts: db.raw('storage_restarts + 1') as unknown as number, storage_restarted_at: now() }),
  setState: (db: Db, id: string, state: NodeState) => db<NodeRow>('nodes').where({ id }).update({ state, updated_at: now() }),
  remove: (db: Db, id: string) => db<NodeRow>('nodes').where({ id }).delete(),
  /** Committed resources per node id, read from the box rows, the data volumes and the bases
   *  saved or imported there. */
  async committed(db: Db): Promise<Map<string, Committed>> {
    // Asked at once (one round trip's wait instead of three).
    const [rows, volumes, bases] = await Promise.all([
      db('boxes').select('node', ...boxConfigSums(db)).groupBy('node'),
      db('data_volumes').select('node').sum({ gb: 'quota_gb' }).groupBy('node') as unknown as Promise<{ node: string; gb: number | string }[]>,
      db('bases').whereNotNull('node').select('node').sum({ b: 'size_bytes' }).groupBy('node') as unknown as Promise<{ node: string; b: number | string }[]>,
    ]);
    const out = new Map<string, Committed>();
    for (const r of rows) {
      const s = configSumsOf(r);
      out.set(r.node, { cpus: s.cpus, ram_mb: s.ram_mb, disk_gb: s.storage_gb, boxes: s.boxes });
    }
    const addDisk = (node: string, gb: number) => {
      const cur = out.get(node) ?? { cpus: 0, ram_mb: 0, disk_gb: 0, boxes: 0 };
      cur.disk_gb += gb;
      out.set(node, cur);
    };
    // Data volumes take their quota from their node's storage too (docs/data.md).
    for (const v of volumes) addDisk(v.node, Number(v.gb));
    // So do the bases saved or imported there (built-in ones, on every node, are not counted).
    for (const b of bases) addDisk(b.node, basesGb(b.b));
    return out;
  },
};
