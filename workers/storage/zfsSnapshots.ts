/**
 * A box root's snapshots on the ZFS storage: user snapshots (`R/boxes/<id>@<name>`, with an
 * optional description), rollback, and a snapshot's destroy that keeps its blocks while forks
 * made from it live (renamed to an internal `_` name, dropped with the last fork).
 */
import { CommandError } from '../../core/command';
import type { BoxSnapshotInfo } from '../drivers';
import { StorageInUseError } from './errors';
import { checkUserSnapshot, DESCRIPTION_PROP, IDMAP_PROP, INTERNAL, isExists, isMissing, snapName } from './zfsCommon';
import type { ZfsDatasets } from './zfsDatasets';

export class ZfsBoxSnapshots {
  constructor(private readonly d: ZfsDatasets) {}

  async snapshotBoxRoot(boxId: string, snapshot: string, description?: string): Promise<void> {
    checkUserSnapshot(snapshot);
    if (description !== undefined && /[\x00-\x1f\x7f]/.test(description)) throw new Error('a snapshot description is one line without control characters');
    const snap = `${this.d.boxDataset(boxId)}@${snapshot}`;
    const args = ['snapshot', ...(description ? ['-o', `${DESCRIPTION_PROP}=${description}`] : []), snap];
    const r = await this.d.zfs(args, true);
    if (r.exitCode === 0 || isExists(r.stderr)) return;
    if (isMissing(r.stderr)) throw new Error(`box root ${boxId} does not exist`);
    throw new CommandError([this.d.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  /**
   * What a rollback to `snapshot` would take from the box's other users: the user snapshots
   * taken after it (`zfs rollback` destroys them) and the boxes forked from the root after it
   * (their origins are internal snapshots after it). Both empty: the rollback loses nothing
   * but the root's changes since the snapshot.
   */
  async rollbackBlockers(boxId: string, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }> {
    checkUserSnapshot(snapshot);
    const ds = this.d.boxDataset(boxId);
    const all = await this.d.snapshotsOf(ds);
    const at = all.indexOf(`${ds}@${snapshot}`);
    if (at < 0) throw new Error(`box ${boxId} has no snapshot ${snapshot}`);
    const later = all.slice(at + 1);
    const clones = later.some((s) => snapName(s).startsWith(INTERNAL)) ? await this.d.snapshotClones(ds) : new Map<string, string[]>();
    return {
      snapshots: later.map(snapName).filter((n) => !n.startsWith(INTERNAL)),
      forks: later.flatMap((s) => clones.get(s) ?? []).map((c) => this.d.boxIdOf(c) ?? c),
    };
  }

  /**
   * Brings the root back to `snapshot` (its container stopped by the caller). Refused with
   * StorageInUseError, before anything changes, while later snapshots or forks depend on what
   * the rollback would destroy; internal snapshots no fork needs any more go with it.
   * Idempotent. A snapshot taken before the root was shifted into its id range marks the root
   * unshifted again, so its next start shifts it (`prepareBoxRoot`).
   */
  async rollbackBoxRoot(boxId: string, snapshot: string): Promise<void> {
    const ds = this.d.boxDataset(boxId);
    const snap = `${ds}@${snapshot}`;
    await this.d.lock.run(async () => {
      const blockers = await this.rollbackBlockers(boxId, snapshot);
      const dependents = [...blockers.snapshots.map((n) => `snapshot ${n}`), ...blockers.forks.map((b) => `fork ${b}`)];
      if (dependents.length > 0) throw new StorageInUseError(`box ${boxId} has ${dependents.join(', ')} after snapshot ${snapshot}`, dependents);
      await this.d.retryBusy(`zfs rollback ${snap}`, async () => {
        const r = await this.d.zfs(['rollback', '-r', snap], true);
        return r.exitCode === 0 ? null : r;
      });
      if ((await this.d.prop(snap, IDMAP_PROP)) === 'none') await this.d.zfs(['set', `${IDMAP_PROP}=none`, ds]);
    });
  }

  async destroyBoxSnapshot(boxId: string, snapshot: string): Promise<void> {
    checkUserSnapshot(snapshot);
    const snap = `${this.d.boxDataset(boxId)}@${snapshot}`;
    await this.d.lock.run(async () => {
      if (!(await this.d.exists(snap))) return;
      if ((await this.d.clonesOf(snap)).length > 0) {
        // Forks made from it still need its blocks: take the name away, keep the data until
        // the last fork goes (destroyBoxRoot drops unused internal origins).
        await this.d.hide(snap);
        return;
      }
      await this.d.destroySnapshot(snap);
    });
  }

  async listBoxSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    return (await this.d.userSnapshots(this.d.boxDataset(boxId), `box root ${boxId} does not exist`, false)).snapshots;
  }
}
