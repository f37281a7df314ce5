import type { Db } from '../knex';
import { now } from '../../core/ids';
import type { DataAttachment, DataBackup } from '../../core/apiTypes';

/** A data volume (db/migrations/009_data.ts). */
export interface VolumeRow {
  id: string;
  name: string;
  project: string | null;
  node: string;
  /** `restoring` from the restore's acceptance to its end: no box mounts it meanwhile. */
  state: 'creating' | 'ready' | 'deleting' | 'restoring';
  quota_gb: number;
  description: string | null;
  size_bytes: number;
  created_by: string | null;
  created_at: string;
  updated_at: string;
}

export interface AttachmentRow {
  volume_id: string;
  box_id: string;
  project: string;
  box: string;
  path: string;
  read_only: boolean | number;
  /** Detached while the box ran: still mounted there until it stops. */
  detached?: boolean | number;
  /** A start of the box has bound it in since it was attached (false until then). */
  mounted?: boolean | number;
  created_at: string;
}

export interface BackupRow {
  id: string;
  volume_id: string;
  name: string;
  status: DataBackup['status'];
  mode: DataBackup['mode'];
  parent: string | null;
  description: string | null;
  error: string | null;
  sha256: string | null;
  size_bytes: number | string | null;
  created_at: string;
  updated_at: string;
}

export const toAttachment = (r: AttachmentRow): DataAttachment => ({ project: r.project, box: r.box, path: r.path, read_only: Boolean(r.read_only) });

export const volumesRepo = {
  byName: (db: Db, name: string) => db<VolumeRow>('data_volumes').where({ name }).first(),
  byId: (db: Db, id: string) => db<VolumeRow>('data_volumes').where({ id }).first(),
  /** Every volume, by name; `projects` limits to those owned by one of them. */
  list: (db: Db, projects: string[] | null) => {
    const q = db<VolumeRow>('data_volumes').orderBy('name');
    if (projects) q.whereIn('project', projects);
    return q;
  },
  /**
   * The end of a move (docs/data.md "Moving a volume to another node"): node `to` holds the
   * volume now; the node it left is to destroy its old dataset (one row per node left, so a
   * second move before the first node looked still reaches it); `to` has nothing to let go of.
   */
  async settleMove(db: Db, id: string, to: string, patch: Partial<VolumeRow>): Promise<void> {
    await db.transaction(async (trx) => {
      const vol = await trx<VolumeRow>('data_volumes').where({ id }).forUpdate().first();
      if (!vol) return;
      if (vol.node !== to) await trx('data_evictions').insert({ volume_id: id, node: vol.node, created_at: now() }).onConflict(['volume_id', 'node']).ignore();
      await trx('data_evictions').where({ volume_id: id, node: to }).delete();
      await trx<VolumeRow>('data_volumes').where({ id }).update({ ...patch, node: to, updated_at: now() });
    });
  },
  /** Node `node` is to destroy its dataset of the volume (a move that failed after its receive). */
  evict: (db: Db, id: string, node: string) => db('data_evictions').insert({ volume_id: id, node, created_at: now() }).onConflict(['volume_id', 'node']).ignore(),
  evictionPending: async (db: Db, id: string, node: string) => Boolean(await db('data_evictions').where({ volume_id: id, node }).first()),
  evictionsOf: (db: Db, node: string) => db<{ volume_id: string; node: string }>('data_evictions').where({ node }).orderBy('volume_id'),
  forgetEviction: (db: Db, id: string, node: string) => db('data_evictions').where({ volume_id: id, node }).delete(),
  /** Locks the row until the transaction ends (Postgres; sqlite's writer is alone already). */
  lock: (db: Db, id: string) => db<VolumeRow>('data_volumes').where({ id }).forUpdate().first(),
  insert: (db: Db, row: VolumeRow) => db<VolumeRow>('data_volumes').insert(row),
  update: (db: Db, id: string, patch: Partial<VolumeRow>) => db<VolumeRow>('data_volumes').where({ id }).update({ ...patch, updated_at: now() }),
  remove: async (db: Db, id: string) => {
    await db('data_backups').where({ volume_id: id }).delete();
    await db('data_attachments').where({ volume_id: id }).delete();
    await db('data_volumes').where({ id }).delete();
  },
  /** Quotas per node: what volumes take from each node's storage. */
  async quotaByNode(db: Db): Promise<Map<string, number>> {
    const rows = (await db('data_volumes').select('node').sum({ gb: 'quota_gb' }).groupBy('node')) as { node: string; gb: number | string }[];
    return new Map(rows.map((r) => [r.node, Number(r.gb)]));
  },
  /** GB of volume quota owned by a project. */
  quotaOfProject: async (db: Db, project: string) => Number(((await db('data_volumes').where({ project }).sum({ gb: 'quota_gb' })) as { gb: number | string | null }[])[0]?.gb ?? 0),

  /** The attachments a volume shows (not those detached from a box still running with it). */
  attachments: (db: Db, volumeIds: string[]) => db<AttachmentRow>('data_attachments').whereIn('volume_id', volumeIds).where({ detached: false }).orderBy([{ column: 'project' }, { column: 'box' }]),
  /** Every box that has the volume mounted or will at its start, lingering detaches included. */
  holders: (db: Db, volumeId: string) => db<AttachmentRow>('data_attachments').where({ volume_id: volumeId }).orderBy([{ column: 'project' }, { column: 'box' }]),
  /** What a box mounts at its start. */
  attachmentsOfBox: (db: Db, boxId: string) => db<AttachmentRow>('data_attachments').where({ box_id: boxId, detached: false }),
  /** What a start binds in: the attached rows `markMounted` marked. */
  mountedOfBox: (db: Db, boxId: string) => db<AttachmentRow>('data_attachments').where({ box_id: boxId, detached: false, mounted: true }),
  /** A row detached from the box while it ran with the volume mounted is taken back: it is
   *  still mounted there. */
  async attach(db: Db, row: AttachmentRow): Promise<void> {
    const lingering = await db<AttachmentRow>('data_attachments').where({ volume_id: row.volume_id, box_id: row.box_id, detached: true }).first();
    if (lingering) await db('data_attachments').where({ volume_id: row.volume_id, box_id: row.box_id, detached: true }).delete();
    await db<AttachmentRow>('data_attachments').insert({ ...row, detached: false, mounted: Boolean(lingering?.mounted) });
  },
  /**
   * `running`: the box's container may run with the volume mounted; then the row stays, marked
   * detached, until the box stops, unless no start has bound it in yet (attached after the box
   * started). The delete asks `mounted = false` in the same statement a start's `markMounted`
   * changes, so one of the two always sees the other.
   */
  async detach(db: Db, volumeId: string, boxId: string, running: boolean): Promise<void> {
    const q = () => db<AttachmentRow>('data_attachments').where({ volume_id: volumeId, box_id: boxId });
    if (!running) return void (await q().delete());
    if ((await q().where({ mounted: false }).delete()) === 0) await q().update({ detached: true });
  },
  /** A start is about to bind in the box's attached volumes: from now on they count as mounted
   *  (before the rows are read, so a detach in between leaves the row, marked, not gone). */
  markMounted: (db: Db, boxId: string) => db<AttachmentRow>('data_attachments').where({ box_id: boxId, detached: false, mounted: false }).update({ mounted: true }),
  /** A box started or stopped: volumes detached from it while it ran are no longer mounted. */
  async dropDetached(db: Db, boxId: string): Promise<void> {
    // A read first: on the start and stop path of every box, most of which have none.
    if (!(await db<AttachmentRow>('data_attachments').where({ box_id: boxId, detached: true }).first())) return;
    await db<AttachmentRow>('data_attachments').where({ box_id: boxId, detached: true }).delete();
  },

  backups: (db: Db, volumeId: string) => db<BackupRow>('data_backups').where({ volume_id: volumeId }).orderBy([{ column: 'created_at' }, { column: 'id' }]),
  backup: (db: Db, volumeId: string, name: string) => db<BackupRow>('data_backups').where({ volume_id: volumeId, name }).first(),
  backupById: (db: Db, id: string) => db<BackupRow>('data_backups').where({ id }).first(),
  insertBackup: (db: Db, row: BackupRow) => db<BackupRow>('data_backups').insert(row),
  updateBackup: (db: Db, id: string, patch: Partial<BackupRow>) => db<BackupRow>('data_backups').where({ id }).update({ ...patch, updated_at: now() }),
};
