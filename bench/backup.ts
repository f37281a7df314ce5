import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import type { Api } from './api';
import { nowMs } from './stats';

/**
 * Data volume backups against the raw tools (docs/data.md): a full backup through the API (POST
 * …/backups?wait: the job's snapshot, `zfs send` to the file, fsync, sha256, rename, manifest)
 * against `zfs snapshot` + `zfs send > file` of the same data run by hand. Each volume holds `mb` MiB of random data
 * written in a box; one full backup per volume (a second would be incremental).
 */
export async function benchBackup(opts: { api: Api; project: string; datasetOf: (volume: string) => Promise<string>; mb: number; runs: number; progress: (m: string) => void }): Promise<{ api: number[]; raw: number[]; durable: number[]; bytes: number }> {
  const { api, project, mb, runs } = opts;
  const names = Array.from({ length: runs }, (_, i) => `bench-vol-${i}`);
  for (const name of names) {
    const r = await api.call('POST', '/v1/data', { name, size_gb: Math.max(1, Math.ceil((mb * 2) / 1024)) });
    if (r.status !== 201) throw new Error(`volume ${name}: ${r.status} ${r.text}`);
  }
  const box = await api.call('POST', `/v1/projects/${project}/boxes?wait=300`, { name: 'bench-backup', data_mounts: names.map((name, i) => ({ name, path: `/v${i}` })) });
  if (box.body?.status !== 'running') throw new Error(`the backup box: ${box.status} ${box.text}`);
  const fill = await api.call('POST', `/v1/projects/${project}/boxes/bench-backup/exec`, {
    command: ['sh', '-c', `head -c ${mb * 1024 * 1024} /dev/urandom > /v0/blob && for i in $(seq 1 ${runs - 1}); do cp /v0/blob /v$i/blob; done && sync`],
    timeout_secs: 600,
  });
  if (fill.body?.exit_code !== 0) throw new Error(`filling the volumes: ${fill.text}`);
  opts.progress(`backup: ${runs} volumes of ${mb} MiB filled`);

  const apiMs: number[] = [];
  const rawMs: number[] = [];
  /** The floor plus what a backup promises beyond it: the file on disk (fsync) and its sha256. */
  const durableMs: number[] = [];
  let bytes = 0;
  const scratch = fs.mkdtempSync(path.join(os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir(), 'bench-send-'));
  try {
    for (const [i, name] of names.entries()) {
      // The raw floor sends a snapshot of the same data, taken by hand; the two take turns going
      // first so neither always reads blocks the other just brought into the cache.
      const api1 = async () => {
        const t0 = nowMs();
        const r = await api.call('POST', `/v1/data/${name}/backups?wait=300`, { name: 'full' });
        apiMs.push(nowMs() - t0);
        if (r.status !== 200 || r.body?.status !== 'completed') throw new Error(`backup of ${name}: ${r.status} ${r.text}`);
        bytes = r.body.size_bytes;
      };
      const ds = await opts.datasetOf(name);
      const raw1 = async () => {
        const file = path.join(scratch, `${name}.zfs`);
        // A backup of a live volume is a snapshot and its stream: the floor does both by hand.
        const t1 = nowMs();
        await zfsLines(['snapshot', `${ds}@rawbench`]);
        await sendToFile(`${ds}@rawbench`, file);
        rawMs.push(nowMs() - t1);
        fs.rmSync(file, { force: true });
        const t2 = nowMs();
        await zfsLines(['snapshot', `${ds}@rawbench2`]);
        await sendToFile(`${ds}@rawbench2`, file);
        const fd = fs.openSync(file, 'r');
        fs.fsyncSync(fd);
        fs.closeSync(fd);
        const hash = crypto.createHash('sha256');
        for await (const chunk of fs.createReadStream(file, { highWaterMark: 1024 * 1024 })) hash.update(chunk as Buffer);
        hash.digest('hex');
        durableMs.push(nowMs() - t2);
        fs.rmSync(file, { force: true });
      };
      if (i % 2 === 0) {
        await api1();
        await raw1();
      } else {
        await raw1();
        await api1();
      }
    }
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
    await api.call('DELETE', `/v1/projects/${project}/boxes/bench-backup?wait=120`);
    for (const name of names) await api.call('DELETE', `/v1/data/${name}`);
  }
  return { api: apiMs, raw: rawMs, durable: durableMs, bytes };
}

function zfsLines(args: string[]): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const c = spawn('zfs', args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    c.stdout.on('data', (b: Buffer) => (out += b.toString()));
    c.on('error', reject);
    c.on('close', (code) => (code === 0 ? resolve(out.split('\n').filter(Boolean)) : reject(new Error(`zfs ${args.join(' ')} exited ${code}`))));
  });
}

/** `zfs send SNAP > FILE`, as a shell would run it. */
function sendToFile(snap: string, file: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const fd = fs.openSync(file, 'w');
    const c = spawn('zfs', ['send', snap], { stdio: ['ignore', fd, 'inherit'] });
    c.on('error', reject);
    c.on('close', (code) => {
      fs.closeSync(fd);
      if (code === 0) resolve();
      else reject(new Error(`zfs send ${snap} exited ${code}`));
    });
  });
}
