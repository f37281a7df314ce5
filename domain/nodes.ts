import type { Db } from '../db/knex';
import { Committed, NodeRow, NodeState, nodesRepo } from '../db/repos/nodes';
import { BoxhostError, conflict, invalidField, notFound, unavailable } from '../core/errors';
import type { NodeClient } from '../cluster/types';
import { HttpNodeClient } from '../cluster/httpClient';
import type { Node } from '../core/apiTypes';
import { boxesRepo } from '../db/repos/boxes';
import { volumesRepo } from '../db/repos/volumes';
import { operationsRepo } from '../db/repos/operations';

export interface NodeDirectoryOptions {
  /** BOXHOST_CLUSTER_SECRET: what the api shows the node agents. */
  secret?: string;
  /** A node whose last heartbeat is older than this is down. */
  timeoutMs: number;
}

/** Rows are read again at most this often per process (a heartbeat is every few seconds). */
const CACHE_MS = 500;

const EMPTY: Committed = { cpus: 0, ram_mb: 0, disk_gb: 0, boxes: 0 };

/** What a box asks of its node (a delta for an update). */
export interface Need {
  cpus: number;
  ram_mb: number;
  storage_gb: number;
  /** A new box root (a create or a fork; an update asks for none). */
  boxes?: number;
}

/** `roots`: box roots its storage can mount (`alloc_boxes`; zfs-fuse mounts at most 1000
 *  filesystems machine-wide, fewer with a small ARC). */
type Resource = 'cpus' | 'ram_mb' | 'storage' | 'roots';

/** The resources of `need` a node cannot promise on top of what it has promised (null
 *  allocatable: a node of an older version, which is not held to any). */
function shortOf(r: NodeRow, c: Committed, need: Need): Resource[] {
  const out: Resource[] = [];
  if (need.cpus > 0 && r.alloc_cpus !== null && c.cpus + need.cpus > r.alloc_cpus) out.push('cpus');
  if (need.ram_mb > 0 && r.alloc_ram_mb !== null && c.ram_mb + need.ram_mb > r.alloc_ram_mb) out.push('ram_mb');
  if (need.storage_gb > 0 && r.alloc_disk_gb !== null && c.disk_gb + need.storage_gb > r.alloc_disk_gb) out.push('storage');
  if ((need.boxes ?? 0) > 0 && r.alloc_boxes != null && c.boxes + (need.boxes ?? 0) > r.alloc_boxes) out.push('roots');
  return out;
}

/** Storage is what runs out: its space, or what it can mount. */
const isStorage = (res: Resource) => res === 'storage' || res === 'roots';

const DETAIL: Record<Resource, { field: string; issue: string }> = {
  cpus: { field: 'config.cpus', issue: 'no node has room for it' },
  ram_mb: { field: 'config.ram_mb', issue: 'no node has room for it' },
  storage: { field: 'config.storage_gb', issue: 'no node has room for it' },
  roots: { field: 'name', issue: 'no node can mount another box root' },
};

/** The refusal: 507 insufficient_storage when storage (space or mounts) alone is short on every
 *  node, else 409. */
function noRoom(where: string, nodes: [NodeRow, Committed][], need: Need): BoxhostError {
  const shorts = nodes.map(([r, c]) => [r, c, shortOf(r, c, need)] as const);
  const what = (res: Resource, r: NodeRow, c: Committed) =>
    res === 'cpus'
      ? `${c.cpus} of ${r.alloc_cpus} cpus`
      : res === 'ram_mb'
        ? `${c.ram_mb} of ${r.alloc_ram_mb} MB RAM`
        : res === 'storage'
          ? `${c.disk_gb} of ${r.alloc_disk_gb} GB storage`
          : `${c.boxes} of the ${r.alloc_boxes} box roots its storage can mount`;
  const why = shorts.map(([r, c, s]) => `node ${r.id} has ${s.map((res) => what(res, r, c)).join(', ')} promised`).join('; ');
  // Only what is asked for: storage alone (a data volume) or more cpus (an update) is said as
  // such, not as a box of 0 cpus and 0 MB RAM.
  const parts = [need.cpus ? `${need.cpus} cpus` : '', need.ram_mb ? `${need.ram_mb} MB RAM` : '', need.storage_gb ? `${need.storage_gb} GB storage` : ''].filter(Boolean);
  const asked = `${need.boxes ? 'a box of ' : ''}${parts.join(', ') || 'nothing'}`;
  const all = [...new Set(shorts.flatMap(([, , s]) => s))];
  const hint = all.includes('roots') ? ' (zfs-fuse mounts at most 1000 filesystems per machine, fewer with a small max-arc-size; delete boxes there, or add a node)' : '';
  const message = `${where} has no room for ${asked} more: ${why}${hint}`;
  return new BoxhostError(shorts.every(([, , s]) => s.length > 0 && s.every(isStorage)) ? 'insufficient_storage' : 'conflict', message, all.map((res) => DETAIL[res]));
}

/**
 * The nodes as the api sees them: which are up, how to reach each (`client`), and where a new
 * box goes (`place`). A node in this very process is reached in-process and is up by
 * definition; any other is up while its heartbeat is fresh, and reached through its agent.
 */
export class NodeDirectory {
  private readonly local = new Map<string, NodeClient>();
  private readonly remote = new Map<string, HttpNodeClient>();
  private cache?: { at: number; rows: Promise<NodeRow[]> };

  constructor(
    private readonly db: Db,
    private readonly opts: NodeDirectoryOptions,
  ) {}

  /** The node of this process: calls to its boxes skip the network. */
  addLocal(client: NodeClient): void {
    this.local.set(client.nodeId, client);
  }

  /** Whether `id` is the node of this process (its boxes are on this machine's bridges). */
  isLocal(id: string): boolean {
    return this.local.has(id);
  }

  private rows(fresh = false): Promise<NodeRow[]> {
    if (fresh || !this.cache || Date.now() - this.cache.at > CACHE_MS) {
      // A real promise: a knex builder runs its query again at each `then` (the `catch` below
      // and every caller's await did, so the cache saved nothing).
      const rows: Promise<NodeRow[]> = Promise.resolve(nodesRepo.list(this.db));
      this.cache = { at: Date.now(), rows };
      rows.catch(() => (this.cache = undefined));
    }
    return this.cache.rows;
  }

  /** null when the node is up, else why it is not. */
  private downReason(id: string, row: NodeRow | undefined): string | null {
    if (this.local.has(id)) return null;
    if (!row) return `node ${id} is not registered`;
    if (!row.heartbeat_at) return `node ${id} is stopped`;
    const age = Date.now() - Date.parse(row.heartbeat_at);
    if (age > this.opts.timeoutMs) return `node ${id} is not answering (last heartbeat ${row.heartbeat_at})`;
    return null;
  }

  /** Node id → why it is down, for every registered node of `ids` that is down (one query). */
  async downNodes(ids: Iterable<string>): Promise<Map<string, string>> {
    const wanted = [...new Set(ids)].filter((id) => !this.local.has(id));
    const out = new Map<string, string>();
    if (wanted.length === 0) return out;
    const rows = new Map((await this.rows()).map((r) => [r.id, r]));
    for (const id of wanted) {
      // A node forgotten for good has no row; its boxes' rows already say they are lost.
      if (!rows.has(id)) continue;
      const reason = this.downReason(id, rows.get(id));
      if (reason) out.set(id, reason);
    }
    return out;
  }

  /** How to reach a node; 503 when it is down or has no agent the api can use. */
  async client(id: string): Promise<NodeClient> {
    const local = this.local.get(id);
    if (local) return local;
    const row = (await this.rows()).find((r) => r.id === id);
    const reason = this.downReason(id, row);
    if (reason) throw unavailable(reason);
    if (!row!.agent_url) throw unavailable(`node ${id} has no agent address (it runs without BOXHOST_CLUSTER_SECRET)`);
    if (!this.opts.secret) throw unavailable(`node ${id} runs apart from this api, and this api has no BOXHOST_CLUSTER_SECRET to reach it`);
    let c = this.remote.get(id);
    if (!c || c.agentUrl !== row!.agent_url) {
      c = new HttpNodeClient(id, row!.agent_url, this.opts.secret);
      this.remote.set(id, c);
    }
    return c;
  }

  /** 503 unless the node is up (for queued work that would only wait). */
  async assertUp(id: string): Promise<void> {
    const reason = this.downReason(id, (await this.rows()).find((r) => r.id === id));
    if (reason) throw unavailable(reason);
  }

  /**
   * The node a new box goes to (docs/decisions.md "Placement"): among the nodes of the region
   * that are up, active, whose storage answers and that have room for `need` (committed +
   * need ≤ what the node may promise), the one with the most free RAM, then the most free
   * CPUs, then the fewest boxes, then the lowest id. No room anywhere: 507 when storage is what
   * runs out everywhere, else 409 (docs/security.md "Admission"). `passOver`: nodes that cannot
   * take this box whatever their room, and why (the project's addresses there are all held);
   * 409 with those reasons when they are all that is left.
   */
  async place(region: string, need: Need, passOver: ReadonlyMap<string, string> = new Map()): Promise<string> {
    const rows = await this.rows();
    if (rows.length === 0 && this.local.size === 0) throw unavailable('no node has registered yet: start a node');
    const inRegion = rows.filter((r) => r.region === region);
    if (inRegion.length === 0) throw invalidField('config.region', `no node serves region ${region} (regions: ${[...new Set(rows.map((r) => r.region))].join(', ') || 'none'})`);
    const unfit = (r: NodeRow) => (r.state !== 'active' ? `node ${r.id} is ${r.state}` : (this.downReason(r.id, r) ?? (r.storage !== 'ok' ? `node ${r.id}'s storage is failing` : null)));
    const candidates = inRegion.filter((r) => unfit(r) === null);
    if (candidates.length === 0) throw unavailable(`no node of region ${region} can take a box now: ${inRegion.map(unfit).join('; ')}`);
    const committed = await nodesRepo.committed(this.db);
    const withRoom = candidates.filter((r) => shortOf(r, committed.get(r.id) ?? EMPTY, need).length === 0);
    if (withRoom.length === 0) throw noRoom(`region ${region}`, candidates.map((r) => [r, committed.get(r.id) ?? EMPTY]), need);
    const open = withRoom.filter((r) => !passOver.has(r.id));
    if (open.length === 0) throw conflict(withRoom.map((r) => passOver.get(r.id)).join('; '));
    const free = (r: NodeRow) => {
      const c = committed.get(r.id) ?? EMPTY;
      return { ram: r.ram_mb - c.ram_mb, cpus: r.cpus - c.cpus, boxes: c.boxes };
    };
    open.sort((a, b) => {
      const fa = free(a);
      const fb = free(b);
      return fb.ram - fa.ram || fb.cpus - fa.cpus || fa.boxes - fb.boxes || a.id.localeCompare(b.id);
    });
    return open[0].id;
  }

  /** 507/409 unless node `id` has room for `need` more (a fork on its source's node, a box
   *  growing its limits). */
  async assertRoom(id: string, need: Need): Promise<void> {
    const row = (await this.rows()).find((r) => r.id === id);
    if (!row) return; // a node of this process that has not registered yet: nothing to hold
    const c = (await nodesRepo.committed(this.db)).get(id) ?? EMPTY;
    if (shortOf(row, c, need).length) throw noRoom(`node ${id}`, [[row, c]], need);
  }

  /** 404/409/503/507 unless node `id` may take new work of `need` now: registered, `active`, up,
   *  its storage answering, with room (a volume moved there). */
  async assertCanTake(id: string, need: Need): Promise<void> {
    const row = (await this.rows()).find((r) => r.id === id);
    if (!row && !this.local.has(id)) throw notFound(`node ${id}`);
    const reason = this.downReason(id, row);
    if (reason) throw unavailable(reason);
    if (!row) return;
    if (row.state !== 'active') throw conflict(`node ${id} is ${row.state}: it takes no new work`);
    if (row.storage !== 'ok') throw unavailable(`node ${id}'s storage is failing`);
    await this.assertRoom(id, need);
  }

  /**
   * The box-roots limit again, inside the transaction that inserts a new box on node `id`, its
   * row locked (FOR UPDATE on Postgres; a sqlite write transaction is exclusive already): the
   * limit is per node across projects, so the project row's lock does not order these, and
   * creates at the edge must count one after the other.
   */
  async assertRootRoom(trx: Db, id: string, need: Need): Promise<void> {
    const row = await trx<NodeRow>('nodes').where({ id }).forUpdate().first();
    if (!row || row.alloc_boxes == null) return;
    const n = Number((await trx('boxes').where({ node: id }).count({ n: '*' }).first())?.n ?? 0);
    if (n + 1 > row.alloc_boxes) throw noRoom(`node ${id}`, [[row, { ...EMPTY, boxes: n }]], { ...need, boxes: 1 });
  }

  // ------------------------------------------------------------------ admin (GET/PUT/DELETE /v1/nodes)

  private view(r: NodeRow, committed: Committed | undefined): Node {
    const reason = this.downReason(r.id, r);
    return {
      id: r.id,
      name: r.name,
      region: r.region,
      state: r.state,
      status: reason ? 'down' : 'up',
      reason,
      agent_url: r.agent_url,
      version: r.version,
      storage: r.storage,
      storage_restarts: Number(r.storage_restarts ?? 0),
      storage_restarted_at: r.storage_restarted_at ?? null,
      started_at: r.started_at,
      heartbeat_at: r.heartbeat_at,
      capacity: { cpus: r.cpus, ram_mb: r.ram_mb, disk_gb: r.disk_gb },
      allocatable: { cpus: r.alloc_cpus ?? r.cpus, ram_mb: r.alloc_ram_mb ?? r.ram_mb, disk_gb: r.alloc_disk_gb ?? r.disk_gb, boxes: r.alloc_boxes ?? null },
      committed: committed ?? EMPTY,
      created_at: r.created_at,
      updated_at: r.updated_at,
    };
  }

  /** Every node; `committed: false` skips summing the boxes (health and metrics need none). */
  async list(opts: { committed?: boolean } = {}): Promise<Node[]> {
    const [rows, committed] = await Promise.all([this.rows(true), opts.committed === false ? new Map<string, Committed>() : nodesRepo.committed(this.db)]);
    return rows.map((r) => this.view(r, committed.get(r.id)));
  }

  async get(id: string): Promise<Node> {
    const row = await nodesRepo.get(this.db, id);
    if (!row) throw notFound(`node ${id}`);
    return this.view(row, (await nodesRepo.committed(this.db)).get(id));
  }

  /** `draining` keeps the node's boxes and sends no new ones there; `active` takes them again. */
  async setState(id: string, state: NodeState): Promise<Node> {
    if (!(await nodesRepo.setState(this.db, id, state))) throw notFound(`node ${id}`);
    this.cache = undefined;
    return this.get(id);
  }

  /**
   * Forgets a node. One that is up is refused (it would register again). One that holds boxes
   * is refused unless `force`: then the node is gone for good (a dead machine), its boxes are
   * marked failed (they can be deleted: their rows go, nothing on a host is touched), its
   * unfinished operations fail, and its queue is dropped.
   */
  async remove(id: string, opts: { force?: boolean; queue?: { drop(node: string): Promise<void> } } = {}): Promise<void> {
    const n = await this.get(id);
    if (n.status === 'up') throw conflict(`node ${id} is up; stop its process first (a running node registers again)`);
    if (n.committed.boxes > 0 && !opts.force) {
      throw conflict(`node ${id} still holds ${n.committed.boxes} boxes; delete them, or force the removal of a node that is gone for good (its boxes are then lost)`);
    }
    // A volume being moved off it (a restore queued on another node) is not lost with it.
    const leaving = new Set(((await this.db('operations').where({ kind: 'data.restore' }).whereNot({ node: id }).whereIn('status', ['queued', 'running']).select('payload')) as { payload: string }[])
      .map((o) => (JSON.parse(o.payload) as { volumeId?: string }).volumeId));
    const volumes = ((await this.db('data_volumes').where({ node: id }).select('id', 'name')) as { id: string; name: string }[]).filter((v) => !leaving.has(v.id));
    if (volumes.length > 0 && !opts.force) {
      throw conflict(`node ${id} still holds data volumes ${volumes.map((v) => v.name).join(', ')}; move them to another node (restore a backup there: POST /v1/data/{name}/restore with backup and node), delete them, or force the removal of a node that is gone for good (they are then lost)`);
    }
    await this.db.transaction(async (trx) => {
      // Volumes of a node gone for good are lost with it (their backups' files stay in the backup directory).
      for (const v of volumes) await volumesRepo.remove(trx, v.id);
      await trx('data_evictions').where({ node: id }).delete();
      // A move to this node that never ran leaves its volume `restoring` elsewhere: usable again.
      const moves = (await trx('operations').where({ node: id, kind: 'data.restore' }).whereIn('status', ['queued', 'running']).select('payload')) as { payload: string }[];
      const moving = moves.map((m) => (JSON.parse(m.payload) as { volumeId?: string }).volumeId).filter((v): v is string => typeof v === 'string');
      if (moving.length > 0) await trx('data_volumes').whereIn('id', moving).where({ state: 'restoring' }).update({ state: 'ready' });
      await boxesRepo.failOnNode(trx, id, `node ${id} was removed while down: this box is lost; delete it`);
      await operationsRepo.failOnNode(trx, id, `lost: node ${id} was removed`);
      await nodesRepo.remove(trx, id);
    });
    await opts.queue?.drop(id);
    this.cache = undefined;
  }

  /** Whether boxes on node `id` are orphans of a node removed for good (no row, not here). */
  async forgotten(id: string): Promise<boolean> {
    return !this.local.has(id) && !(await nodesRepo.get(this.db, id));
  }
}
