/**
 * Data volumes on ZFS (docs/data.md), beside the box storage of the same pool:
 *
 *   R/data/<volumeId>                 a volume: `quota` (its snapshots count), nosuid,nodev
 *   R/data/<volumeId>@<snapshot>      its user snapshots (the name rule)
 *   R/data/<volumeId>@_bk-<backup>    a backup's snapshot: what the stream was sent from and
 *                                     what the next incremental is sent against
 *   R/tmp/restore-<volumeId>          a restore's chain of streams being received; it takes the
 *   R/tmp/old-<volumeId>              volume's place, the old dataset kept here until dropped
 *
 * `boxhost:restored` on a volume names the restore that made it, so a retried restore job
 * knows it is done; `boxhost:received` on the new dataset says its chain is complete.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { pipeline } from 'node:stream/promises';
import { CommandError } from '../../core/command';
import { FollowWriter, removeParts } from './followWriter';
import type { BackupStreamInfo, IdMap, VolumeDriver, VolumeInfo } from '../drivers';
import { DESCRIPTION_PROP, isExists, lines, quotaArg, snapName, StorageInUseError, USER_SNAPSHOT, type ZfsKit } from './zfs';

const BACKUP_PREFIX = '_bk-';
const RESTORED_PROP = 'boxhost:restored';
const RECEIVED_PROP = 'boxhost:received';
const VOLUME_ID = /^v[a-z0-9]{1,31}$/;
const BACKUP_NAME = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const TOKEN = /^[a-z0-9_]{1,64}$/;

function checkVolume(id: string): void {
  if (!VOLUME_ID.test(id)) throw new Error(`invalid volume id ${JSON.stringify(id)}`);
}
function checkSnapshot(name: string): void {
  if (!USER_SNAPSHOT.test(name)) throw new Error(`invalid snapshot name ${JSON.stringify(name)}`);
}
function checkBackup(name: string): void {
  if (!BACKUP_NAME.test(name)) throw new Error(`invalid backup name ${JSON.stringify(name)}`);
}

export class ZfsVolumes implements VolumeDriver {
  constructor(private readonly k: ZfsKit) {}

  private dataset(id: string): string {
    checkVolume(id);
    return `${this.k.root}/data/${id}`;
  }

  volumePath(id: string): string {
    checkVolume(id);
    return path.join(this.k.mountRoot(), 'data', id);
  }

  async hasVolume(id: string): Promise<boolean> {
    return this.k.exists(this.dataset(id));
  }

  async createVolume(id: string, quotaGb: number): Promise<void> {
    if (!(Number.isInteger(quotaGb) && quotaGb > 0)) throw new Error(`invalid volume size ${quotaGb} GB`);
    const ds = this.dataset(id);
    const args = ['create', '-o', `quota=${quotaArg(quotaGb)}`, ds];
    const r = await this.k.zfs(args, true);
    if (r.exitCode !== 0 && !isExists(r.stderr)) throw new CommandError([this.k.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
    await this.k.ensureMounted(ds);
    await this.k.mountPrivately(this.volumePath(id));
  }

  async destroyVolume(id: string): Promise<void> {
    await this.destroyVolumeIf(id, async () => true);
  }

  async destroyVolumeIf(id: string, ok: () => Promise<boolean>): Promise<boolean> {
    return this.k.serialized(async () => {
      if (!(await ok())) return false;
      await this.k.destroyDataset(this.dataset(id));
      await this.k.destroyDataset(`${this.k.root}/tmp/restore-${id}`);
      await this.k.destroyDataset(`${this.k.root}/tmp/old-${id}`);
      return true;
    });
  }

  async prepareVolume(id: string, idMap?: IdMap): Promise<void> {
    const ds = this.dataset(id);
    await this.k.ensureMounted(ds);
    const dir = this.volumePath(id);
    await this.k.mountPrivately(dir);
    if (!idMap) return;
    const st = await fs.promises.lstat(dir);
    // Only the top directory: files a box wrote are in its range already.
    if (st.uid < idMap.hostId || st.uid >= idMap.hostId + idMap.size) await fs.promises.lchown(dir, idMap.hostId, idMap.hostId);
  }

  async info(id: string): Promise<VolumeInfo> {
    return this.k.userSnapshots(this.dataset(id), `volume ${id} does not exist`);
  }

  async snapshotVolume(id: string, snapshot: string, description?: string): Promise<void> {
    checkSnapshot(snapshot);
    if (description !== undefined && /[\x00-\x1f\x7f]/.test(description)) throw new Error('a snapshot description is one line without control characters');
    const args = ['snapshot', ...(description ? ['-o', `${DESCRIPTION_PROP}=${description}`] : []), `${this.dataset(id)}@${snapshot}`];
    const r = await this.k.zfs(args, true);
    if (r.exitCode === 0 || isExists(r.stderr)) return;
    throw new CommandError([this.k.zfsBin, ...args], r.exitCode, r.stdout, r.stderr);
  }

  async destroyVolumeSnapshot(id: string, snapshot: string): Promise<void> {
    checkSnapshot(snapshot);
    await this.k.destroySnapshot(`${this.dataset(id)}@${snapshot}`);
  }

  async rollbackVolume(id: string, snapshot: string): Promise<void> {
    checkSnapshot(snapshot);
    const ds = this.dataset(id);
    const snap = `${ds}@${snapshot}`;
    await this.k.serialized(async () => {
      const all = await this.k.snapshotsOf(ds);
      const at = all.indexOf(snap);
      if (at < 0) throw new Error(`volume ${id} has no snapshot ${snapshot}`);
      const laterUser = all.slice(at + 1).map(snapName).filter((n) => !n.startsWith('_'));
      if (laterUser.length > 0) throw new StorageInUseError(`the volume has snapshots taken after ${snapshot}: ${laterUser.join(', ')}`, laterUser);
      await this.k.retryBusy(`zfs rollback ${snap}`, async () => {
        const r = await this.k.zfs(['rollback', '-r', snap], true);
        return r.exitCode === 0 ? null : r;
      });
    });
  }

  private backupSnapshot(id: string, backup: string): string {
    checkBackup(backup);
    return `${this.dataset(id)}@${BACKUP_PREFIX}${backup}`;
  }

  async holdForBackup(id: string, backup: string): Promise<void> {
    const snap = this.backupSnapshot(id, backup);
    const r = await this.k.zfs(['snapshot', snap], true);
    if (r.exitCode !== 0 && !isExists(r.stderr)) throw new CommandError([this.k.zfsBin, 'snapshot', snap], r.exitCode, r.stdout, r.stderr);
  }

  async hasBackupSnapshot(id: string, backup: string): Promise<boolean> {
    return this.k.exists(this.backupSnapshot(id, backup));
  }

  async dropBackupSnapshot(id: string, backup: string): Promise<void> {
    await this.k.destroySnapshot(this.backupSnapshot(id, backup));
  }

  async pruneBackupSnapshots(id: string, keep: string): Promise<void> {
    checkBackup(keep);
    const ds = this.dataset(id);
    for (const snap of await this.k.snapshotsOf(ds)) {
      const n = snapName(snap);
      if (n.startsWith(BACKUP_PREFIX) && n !== `${BACKUP_PREFIX}${keep}`) await this.k.destroySnapshot(snap);
    }
  }

  async abandonRestore(id: string): Promise<void> {
    const ds = this.dataset(id);
    const old = `${this.k.root}/tmp/old-${id}`;
    await this.k.serialized(async () => {
      if (!(await this.k.exists(ds)) && (await this.k.exists(old))) {
        await this.rename(old, ds);
        await this.k.ensureMounted(ds);
        await this.k.mountPrivately(this.volumePath(id));
      }
      await this.k.destroyDataset(`${this.k.root}/tmp/restore-${id}`);
    });
  }

  /**
   * `zfs send` straight into the file (its stdout is the file, as `zfs send > file`: no copy
   * through this process), not through the gate of short `zfs` commands (a send may run for
   * minutes). Hashed and flushed while it is written (`FollowWriter`: the sha256 read from the
   * page cache right behind the send, fdatasync every 32 MiB), so the end waits only for the
   * tail. Written as `.part-<random>` (one per attempt) and renamed at the end, so a file under
   * its final name is always whole. Progress: the bytes hashed so far, each second.
   */
  async sendBackup(id: string, backup: string, parent: string | null, file: string, progress?: (bytes: number) => void): Promise<BackupStreamInfo> {
    const snap = this.backupSnapshot(id, backup);
    const args = ['send', ...(parent ? ['-i', this.backupSnapshot(id, parent)] : []), snap];
    await fs.promises.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    // A name of this attempt's own: the send of an attempt whose worker was killed may still be
    // writing into the last one (it outlives its parent), and would corrupt what this one hashes.
    await removeParts(file);
    const part = `${file}.part-${crypto.randomBytes(6).toString('hex')}`;
    const out = await fs.promises.open(part, 'wx', 0o600);
    let code: number | null = null;
    let sent: { bytes: number; sha256: string } | undefined;
    const stderr: Buffer[] = [];
    const follower = new FollowWriter(part, out);
    const timer = progress ? setInterval(() => progress(follower.bytes), 1000) : undefined;
    try {
      const child = spawn(this.k.zfsBin, args, { stdio: ['ignore', out.fd, 'pipe'] });
      child.stderr!.on('data', (b: Buffer) => stderr.length < 64 && stderr.push(b));
      code = await new Promise<number | null>((resolve, reject) => {
        child.on('error', reject);
        child.on('close', resolve);
      });
      if (code === 0) sent = await follower.finish();
    } finally {
      if (timer) clearInterval(timer);
      if (!sent) await follower.abandon();
      await out.close();
    }
    if (code !== 0 || !sent) {
      await fs.promises.rm(part, { force: true });
      throw new CommandError([this.k.zfsBin, ...args], code, '', Buffer.concat(stderr).toString());
    }
    await fs.promises.rename(part, file);
    return sent;
  }

  async receiveBackups(id: string, files: string[], quotaGb: number, token: string): Promise<void> {
    if (!TOKEN.test(token)) throw new Error('invalid restore token');
    if (files.length === 0) throw new Error('a restore needs at least one backup stream');
    const ds = this.dataset(id);
    const fresh = `${this.k.root}/tmp/restore-${id}`;
    const old = `${this.k.root}/tmp/old-${id}`;
    await this.k.serialized(async () => {
      if ((await this.k.exists(ds)) && (await this.k.prop(ds, RESTORED_PROP)) === token) {
        await this.k.destroyDataset(old);
        return;
      }
      // Swapped in before the worker died, not yet marked: finish from the rename on.
      const swapped = (await this.k.exists(ds)) && (await this.k.prop(ds, RECEIVED_PROP)) === token;
      if (!swapped) {
        if (!((await this.k.exists(fresh)) && (await this.k.prop(fresh, RECEIVED_PROP)) === token)) {
          await this.k.destroyDataset(fresh);
          for (const [i, f] of files.entries()) await this.receive(fresh, f, i > 0);
          await this.k.zfs(['set', `${RECEIVED_PROP}=${token}`, fresh]);
        }
        if (await this.k.exists(ds)) {
          await this.k.destroyDataset(old);
          await this.k.zfs(['umount', ds], true);
          await this.rename(ds, old);
        }
        await this.rename(fresh, ds);
      }
      await this.k.zfs(['set', `quota=${quotaArg(quotaGb)}`, ds]);
      await this.k.zfs(['set', `${RESTORED_PROP}=${token}`, ds]);
      await this.k.zfs(['inherit', RECEIVED_PROP, ds], true);
      await this.k.ensureMounted(ds);
      await this.k.mountPrivately(this.volumePath(id));
      await this.k.destroyDataset(old);
    });
  }

  private async receive(target: string, file: string, incremental: boolean): Promise<void> {
    // Received unmounted (-u): a mounted one is "busy" to the renames that follow on zfs-fuse;
    // -F rolls the target back to the stream's base should anything have touched it.
    const args = ['receive', '-u', ...(incremental ? ['-F'] : []), target];
    const child = spawn(this.k.zfsBin, args, { stdio: ['pipe', 'ignore', 'pipe'] });
    const stderr: Buffer[] = [];
    child.stderr.on('data', (b: Buffer) => stderr.length < 64 && stderr.push(b));
    const exited = new Promise<number | null>((resolve, reject) => {
      child.on('error', reject);
      child.on('close', resolve);
    });
    await Promise.all([pipeline(fs.createReadStream(file), child.stdin).catch(() => undefined), exited]);
    const code = await exited;
    if (code !== 0) throw new CommandError([this.k.zfsBin, ...args], code, '', Buffer.concat(stderr).toString());
  }

  private async rename(from: string, to: string): Promise<void> {
    let attempt = 0;
    await this.k.retryBusy(`zfs rename ${from}`, async () => {
      if (attempt++ > 0) await this.k.zfs(['umount', '-f', from], true);
      const r = await this.k.zfs(['rename', from, to], true);
      if (r.exitCode === 0) return null;
      // zfs-fuse renames, then may fail to remount: the rename is done when `to` is there.
      if ((await this.k.exists(to)) && !(await this.k.exists(from))) return null;
      return r;
    });
  }

  async listVolumes(): Promise<string[]> {
    const r = await this.k.zfs(['list', '-H', '-o', 'name', '-t', 'filesystem', '-r', '-d', '1', `${this.k.root}/data`]);
    return lines(r.stdout).map((n) => n.slice(`${this.k.root}/data/`.length)).filter((n) => VOLUME_ID.test(n));
  }
}

