/**
 * 3c. a full backup of a data volume through the API vs `zfs snapshot` + `zfs send > file`, and
 *     vs the same floor with the fsync and sha256 the backup does.
 */
import { benchBackup } from '../backup';
import { PROJECT, TARGETS } from '../knobs';
import { figure, Figure, summaryJson } from '../report';
import { round1 } from '../stats';
import type { SectionContext } from './context';

export async function backupSection(ctx: SectionContext): Promise<{ raw: Figure; durable: Figure }> {
  const { api, host, storage, knobs, profiler, figures, results, progress, checkpoint } = ctx;
  profiler.phase = 'backup';
  checkpoint();
  const datasetOf = async (volume: string) => `${storage.root}/data/${((await host.db('data_volumes').where({ name: volume }).first()) as { id: string }).id}`;
  const b = await benchBackup({ api, project: PROJECT, datasetOf, mb: knobs.backupMb, runs: knobs.backupRuns, progress });
  const mbps = (ms: number) => round1(b.bytes / (1024 * 1024) / (ms / 1000));
  const f = figure(`full backup of a ${knobs.backupMb} MiB volume vs zfs snapshot + send > file (${knobs.backupRuns} each)`, b.api, b.raw, 'zfs snapshot + zfs send > file', TARGETS.backup);
  figures.push(f);
  results.backup = { bytes: b.bytes, api: summaryJson(f.boxhost), raw: summaryJson(f.floor), api_mb_per_s: mbps(f.boxhost.p50), raw_mb_per_s: mbps(f.floor.p50), speed_ratio: round1(f.floor.p50 / f.boxhost.p50 * 100) / 100 };
  progress(`backup done: ${results.backup.api_mb_per_s} MB/s through the API vs ${results.backup.raw_mb_per_s} MB/s raw (${results.backup.speed_ratio.toFixed(2)}x the speed)`);
  // The same floor plus fsync and sha256 of the file, as the backup does: what is left is
  // the API, the job and the manifest.
  const d = figure(`full backup of a ${knobs.backupMb} MiB volume vs snapshot + send > file + fsync + sha256 by hand (${knobs.backupRuns} each)`, b.api, b.durable, 'snapshot + send + fsync + sha256', TARGETS.backup);
  figures.push(d);
  Object.assign(results.backup, { durable: summaryJson(d.floor), durable_mb_per_s: mbps(d.floor.p50), durable_speed_ratio: round1(d.floor.p50 / d.boxhost.p50 * 100) / 100 });
  return { raw: f, durable: d };
}
