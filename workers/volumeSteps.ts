import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { JobRefused } from '../jobs/types';
import type { BackupStream, VolumeHost } from '../jobs/ports';
import type { VolumeDriver } from './drivers';
import { removeParts } from './storage/followWriter';

/** Test-only seam, as in boxSteps.ts: the process dies at the step BOXHOST_TEST_CRASH_AT names. */
const crashPoint = (point: string) => void (process.env.BOXHOST_TEST_CRASH_AT === point && process.kill(process.pid, 'SIGKILL'));

/** Where a backup's stream and manifest are: `<backupDir>/<volumeId>/<backup>.zfs|.json`. */
export function backupFiles(backupDir: string, volumeId: string, backup: string): { stream: string; manifest: string } {
  if (!/^v[a-z0-9]{1,31}$/.test(volumeId) || !/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/.test(backup)) throw new Error('invalid backup reference');
  const dir = path.join(backupDir, volumeId);
  return { stream: path.join(dir, `${backup}.zfs`), manifest: path.join(dir, `${backup}.json`) };
}

/** A backup's stream file whose bytes no longer hash to what was recorded when it was written. */
export class BackupCorruptError extends JobRefused {
  override name = 'BackupCorruptError';
}

async function sha256Of(file: string): Promise<string> {
  const hash = crypto.createHash('sha256');
  await pipeline(fs.createReadStream(file), hash);
  return hash.digest('hex');
}

/**
 * The node's side of data volume jobs (docs/data.md), every step idempotent. Backups go to the
 * backup directory (BOXHOST_BACKUP_DIR), named by volume id and backup name, so a directory
 * shared by several nodes (a mounted remote filesystem) lets any of them restore it.
 */
export class VolumeSteps implements VolumeHost {
  readonly nodeId: string;

  constructor(private readonly d: { volumes: VolumeDriver; backupDir: string; nodeId: string }) {
    this.nodeId = d.nodeId;
  }

  async create(volumeId: string, quotaGb: number): Promise<void> {
    await this.d.volumes.createVolume(volumeId, quotaGb);
  }

  async destroy(volumeId: string): Promise<void> {
    await this.d.volumes.destroyVolume(volumeId);
    await fs.promises.rm(path.join(this.d.backupDir, volumeId), { recursive: true, force: true });
  }

  async usedBytes(volumeId: string): Promise<number> {
    return (await this.d.volumes.info(volumeId)).usedBytes;
  }

  async snapshot(volumeId: string, name: string, description?: string): Promise<void> {
    await this.d.volumes.snapshotVolume(volumeId, name, description);
  }

  async deleteSnapshot(volumeId: string, name: string): Promise<void> {
    await this.d.volumes.destroyVolumeSnapshot(volumeId, name);
  }

  async rollback(volumeId: string, snapshot: string): Promise<void> {
    await this.d.volumes.rollbackVolume(volumeId, snapshot);
  }

  hasBackupBase(volumeId: string, backup: string): Promise<boolean> {
    return this.d.volumes.hasBackupSnapshot(volumeId, backup);
  }

  async backup(volumeId: string, b: { name: string; parent: string | null; description: string | null }, progress: (bytes: number) => void): Promise<{ bytes: number; sha256: string }> {
    const files = backupFiles(this.d.backupDir, volumeId, b.name);
    await this.d.volumes.holdForBackup(volumeId, b.name);
    crashPoint('data-backup:held');
    const sent = await this.d.volumes.sendBackup(volumeId, b.name, b.parent, files.stream, progress);
    // The manifest makes the directory explain itself (and restorable without the db's rows).
    const manifest = { volume: volumeId, name: b.name, mode: b.parent ? 'incremental' : 'full', parent: b.parent, description: b.description, bytes: sent.bytes, sha256: sent.sha256, written_at: new Date().toISOString() };
    await fs.promises.writeFile(`${files.manifest}.part`, `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o600 });
    await fs.promises.rename(`${files.manifest}.part`, files.manifest);
    await this.d.volumes.pruneBackupSnapshots(volumeId, b.name);
    return sent;
  }

  async restore(volumeId: string, chain: BackupStream[], quotaGb: number, token: string): Promise<void> {
    const streams = chain.map((c) => ({ ...c, file: backupFiles(this.d.backupDir, volumeId, c.backup).stream }));
    for (const s of streams) {
      const st = await fs.promises.stat(s.file).catch(() => null);
      if (!st) throw new BackupCorruptError(`backup ${s.backup} is missing from the backup directory`);
      if ((await sha256Of(s.file)) !== s.sha256) throw new BackupCorruptError(`backup ${s.backup} is corrupt: its sha256 does not match the one recorded when it was written; the volume was not touched`);
    }
    crashPoint('data-restore:verified');
    await this.d.volumes.receiveBackups(volumeId, streams.map((s) => s.file), quotaGb, token);
    await this.d.volumes.pruneBackupSnapshots(volumeId, chain[chain.length - 1].backup);
  }

  async abandonRestore(volumeId: string): Promise<void> {
    await this.d.volumes.abandonRestore(volumeId);
  }

  async abandonBackup(volumeId: string, backup: string): Promise<void> {
    const files = backupFiles(this.d.backupDir, volumeId, backup);
    await Promise.all([files.stream, files.manifest, `${files.manifest}.part`].map((f) => fs.promises.rm(f, { force: true })));
    await removeParts(files.stream);
    if (await this.d.volumes.hasVolume(volumeId)) await this.d.volumes.dropBackupSnapshot(volumeId, backup);
  }
}
