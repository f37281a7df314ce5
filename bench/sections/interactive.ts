/**
 * 2b. interactive: WebSocket exec's time to its first output byte beside HTTP exec, and the files
 *     API's upload and download beside raw `cat` into and out of the box's root (issue 9).
 */
import { execApi, CreateSample } from '../boxes';
import { benchInteractive } from '../interactive';
import { PROJECT, TARGETS } from '../knobs';
import { figure, summaryJson } from '../report';
import { fmtMs, round1, summarize } from '../stats';
import type { SectionContext } from './context';

export async function interactiveSection(ctx: SectionContext, target: CreateSample): Promise<void> {
  const { api, config, storage, knobs, profiler, figures, notes, results, progress, checkpoint } = ctx;
  checkpoint();
  profiler.phase = 'interactive';
  progress(`interactive: ${knobs.wsExecs} WebSocket execs (time to first byte) beside HTTP exec; files: ${knobs.fileMb} MiB up and down through the API beside raw cat into and out of the box root (${knobs.fileRuns} each)`);
  const inter = await benchInteractive({
    api, project: PROJECT, box: target.name, rootfs: storage.boxRootPath(target.box.id), scratch: config.dataDir, runs: knobs.fileRuns, fileMb: knobs.fileMb, execs: knobs.wsExecs,
    execApi: async () => (await execApi(api, target.name, ['echo', 'x'])).ms,
  });
  // Throughput: MB/s of the API ≥ 0.5× raw cat's is time ≤ 2× raw's.
  figures.push(figure(`files upload ${knobs.fileMb} MiB (time)`, inter.upload, inter.rawUpload, 'cat > <box root>/file on the host', TARGETS.files));
  figures.push(figure(`files download ${knobs.fileMb} MiB (time)`, inter.download, inter.rawDownload, 'cat <box root>/file on the host', TARGETS.files));
  const mbps = (ms: number[]) => knobs.fileMb / (summarize(ms).p50 / 1000);
  results.interactive = {
    ws_first_byte: summaryJson(summarize(inter.wsFirstByte)),
    http_exec_echo: summaryJson(summarize(inter.httpExec)),
    upload_mb_s: round1(mbps(inter.upload)), raw_upload_mb_s: round1(mbps(inter.rawUpload)),
    download_mb_s: round1(mbps(inter.download)), raw_download_mb_s: round1(mbps(inter.rawDownload)),
    samples_ms: { upload: inter.upload.map(round1), raw_upload: inter.rawUpload.map(round1), download: inter.download.map(round1), raw_download: inter.rawDownload.map(round1) },
  };
  notes.push(`WebSocket exec: first output byte p50 ${fmtMs(summarize(inter.wsFirstByte).p50)} ms (p95 ${fmtMs(summarize(inter.wsFirstByte).p95)}) beside HTTP exec of the same echo p50 ${fmtMs(summarize(inter.httpExec).p50)} ms (whole answer)`);
  notes.push(`files: upload ${mbps(inter.upload).toFixed(0)} MB/s vs raw ${mbps(inter.rawUpload).toFixed(0)} MB/s (${(mbps(inter.upload) / mbps(inter.rawUpload)).toFixed(2)}×), download ${mbps(inter.download).toFixed(0)} MB/s vs raw ${mbps(inter.rawDownload).toFixed(0)} MB/s (${(mbps(inter.download) / mbps(inter.rawDownload)).toFixed(2)}×); target ≥ 0.5× each way`);
  progress(`interactive done: ws first byte p50 ${fmtMs(summarize(inter.wsFirstByte).p50)} ms, upload ${mbps(inter.upload).toFixed(0)}/${mbps(inter.rawUpload).toFixed(0)} MB/s, download ${mbps(inter.download).toFixed(0)}/${mbps(inter.rawDownload).toFixed(0)} MB/s (api/raw)`);
}
