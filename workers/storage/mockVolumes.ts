import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { BackupStreamInfo, IdMap, VolumeDriver, VolumeInfo } from '../drivers';
import { WithFaults } from '../mockFaults';

type Method = keyof VolumeDriver;

interface MockVolume {
  quotaGb: number;
  /** The volume's "contents": what a backup stream carries and a restore brings back. */
  data: string;
  snapshots: { name: string; createdAt: string; description?: string; data: string }[];
  restored?: string;
}

/**
 * VolumeDriver in memory for the jobs' unit tests (no root, no ZFS): a volume is a string of
 * data, snapshots copy it, a backup stream is a small JSON file in a scratch directory, so
 * full/incremental chains, checksums and restores can be driven through their failure paths.
 */
export class MockVolumes extends WithFaults<Method> implements VolumeDriver {
  readonly volumes = new Map<string, MockVolume>();
  /** Where volumes "are mounted": a path only (nothing is made there; the mock keeps no files). */
  private readonly dir = path.join(os.tmpdir(), 'boxhost-mock-volumes');

  private get(id: string): MockVolume {
    const v = this.volumes.get(id);
    if (!v) throw new Error(`volume ${id} does not exist`);
    return v;
  }

  async createVolume(id: string, quotaGb: number): Promise<void> {
    this.fault('createVolume');
    if (!this.volumes.has(id)) this.volumes.set(id, { quotaGb, data: '', snapshots: [] });
  }

  async destroyVolume(id: string): Promise<void> {
    this.fault('destroyVolume');
    this.volumes.delete(id);
  }

  async destroyVolumeIf(id: string, ok: () => Promise<boolean>): Promise<boolean> {
    if (!(await ok())) return false;
    await this.destroyVolume(id);
    return true;
  }

  async hasVolume(id: string): Promise<boolean> {
    return this.volumes.has(id);
  }

  volumePath(id: string): string {
    return path.join(this.dir, 'mnt', id);
  }

  async prepareVolume(id: string, _idMap?: IdMap): Promise<void> {
    this.fault('prepareVolume');
    this.get(id);
  }

  async info(id: string): Promise<VolumeInfo> {
    this.fault('info');
    const v = this.get(id);
    return {
      usedBytes: v.data.length,
      snapshots: v.snapshots.filter((s) => !s.name.startsWith('_')).map((s) => ({ name: s.name, createdAt: s.createdAt, sizeBytes: 0, ...(s.description ? { description: s.description } : {}) })),
    };
  }

  async snapshotVolume(id: string, snapshot: string, description?: string): Promise<void> {
    this.fault('snapshotVolume');
    const v = this.get(id);
    if (!v.snapshots.some((s) => s.name === snapshot)) v.snapshots.push({ name: snapshot, createdAt: new Date().toISOString(), description, data: v.data });
  }

  async destroyVolumeSnapshot(id: string, snapshot: string): Promise<void> {
    const v = this.get(id);
    v.snapshots = v.snapshots.filter((s) => s.name !== snapshot);
  }

  async rollbackVolume(id: string, snapshot: string): Promise<void> {
    this.fault('rollbackVolume');
    const v = this.get(id);
    const at = v.snapshots.findIndex((s) => s.name === snapshot);
    if (at < 0) throw new Error(`volume ${id} has no snapshot ${snapshot}`);
    v.data = v.snapshots[at].data;
    v.snapshots = v.snapshots.slice(0, at + 1);
  }

  async holdForBackup(id: string, backup: string): Promise<void> {
    await this.snapshotVolume(id, `_bk-${backup}`);
  }

  async hasBackupSnapshot(id: string, backup: string): Promise<boolean> {
    return this.get(id).snapshots.some((s) => s.name === `_bk-${backup}`);
  }

  async dropBackupSnapshot(id: string, backup: string): Promise<void> {
    await this.destroyVolumeSnapshot(id, `_bk-${backup}`);
  }

  async pruneBackupSnapshots(id: string, keep: string): Promise<void> {
    const v = this.get(id);
    v.snapshots = v.snapshots.filter((s) => !s.name.startsWith('_bk-') || s.name === `_bk-${keep}`);
  }

  async abandonRestore(): Promise<void> {
    this.fault('abandonRestore');
  }

  async sendBackup(id: string, backup: string, parent: string | null, file: string): Promise<BackupStreamInfo> {
    this.fault('sendBackup');
    const snap = this.get(id).snapshots.find((s) => s.name === `_bk-${backup}`);
    if (!snap) throw new Error(`volume ${id} has no backup snapshot ${backup}`);
    if (parent !== null && !(await this.hasBackupSnapshot(id, parent))) throw new Error(`volume ${id} has no backup snapshot ${parent}`);
    const body = Buffer.from(JSON.stringify({ backup, parent, data: snap.data }));
    await fs.promises.mkdir(path.dirname(file), { recursive: true });
    await fs.promises.writeFile(file, body);
    return { bytes: body.length, sha256: crypto.createHash('sha256').update(body).digest('hex') };
  }

  async receiveBackups(id: string, files: string[], quotaGb: number, token: string): Promise<void> {
    this.fault('receiveBackups');
    const v = this.volumes.get(id);
    if (v?.restored === token) return;
    const streams = await Promise.all(files.map(async (f) => JSON.parse(await fs.promises.readFile(f, 'utf8')) as { backup: string; data: string }));
    const last = streams[streams.length - 1];
    this.volumes.set(id, {
      quotaGb,
      data: last.data,
      snapshots: streams.map((s) => ({ name: `_bk-${s.backup}`, createdAt: new Date().toISOString(), data: s.data })),
      restored: token,
    });
  }

  async listVolumes(): Promise<string[]> {
    return [...this.volumes.keys()];
  }
}
