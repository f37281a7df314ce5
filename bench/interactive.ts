/**
 * The interactive figures (issue 9): WebSocket exec's time to its first output byte beside HTTP
 * exec, and files API upload and download throughput for a file of FILE_MB beside raw `cat`
 * into and out of the box's root on the host, in the same run.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import WebSocket from 'ws';
import { Channel, WS_SUBPROTOCOL } from '../core/wsChannel';
import type { Api } from './api';
import { spawnCollect } from './raw';
import { nowMs } from './stats';

export interface InteractiveSamples {
  wsFirstByte: number[];
  httpExec: number[];
  upload: number[];
  rawUpload: number[];
  download: number[];
  rawDownload: number[];
  fileMb: number;
}

/** Time from opening the socket to the first stdout frame of `echo x`. */
function wsFirstByte(api: Api, project: string, box: string): Promise<number> {
  const url = `${api.url.replace(/^http/, 'ws')}/v1/projects/${project}/boxes/${box}/exec/ws?command=echo&command=x`;
  const t0 = nowMs();
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, WS_SUBPROTOCOL, { headers: { authorization: `Bearer ${api.token}` } });
    let first = 0;
    ws.on('message', (d: Buffer) => {
      if (d[0] === Channel.stdout && !first) first = nowMs() - t0;
      if (d[0] === Channel.status) ws.close();
    });
    ws.on('close', () => (first ? resolve(first) : reject(new Error('no output from the WebSocket exec'))));
    ws.on('error', reject);
  });
}

/** The API's side runs a client process of its own (curl), as raw cat is one: the bench's
 *  process also runs the api, and a client in it would take the api's event loop. */
async function curl(args: string[]): Promise<number> {
  const t0 = nowMs();
  const r = await spawnCollect(['curl', '-sS', '-o', '/dev/null', '-w', '%{http_code}', ...args]);
  if (r.stdout.trim() !== '200') throw new Error(`curl ${args[args.length - 1]} answered ${r.stdout.trim()}: ${r.stderr}`);
  return nowMs() - t0;
}

const put = (api: Api, p: string, file: string) => curl(['-H', `Authorization: Bearer ${api.token}`, '-H', 'Content-Type: application/octet-stream', '-T', file, `${api.url}${p}`]);
const get = (api: Api, p: string) => curl(['-H', `Authorization: Bearer ${api.token}`, `${api.url}${p}`]);

export async function benchInteractive(opts: { api: Api; project: string; box: string; rootfs: string; scratch: string; runs: number; fileMb: number; execs: number; execApi: () => Promise<number> }): Promise<InteractiveSamples> {
  const { api, project, box, rootfs, runs, fileMb } = opts;
  const s: InteractiveSamples = { wsFirstByte: [], httpExec: [], upload: [], rawUpload: [], download: [], rawDownload: [], fileMb };
  for (let i = 0; i < 3; i++) await wsFirstByte(api, project, box);
  for (let i = 0; i < opts.execs; i++) {
    s.wsFirstByte.push(await wsFirstByte(api, project, box));
    s.httpExec.push(await opts.execApi());
  }
  // Random bytes (nothing for compression to take).
  const src = path.join(opts.scratch, `bench-file-${crypto.randomBytes(3).toString('hex')}`);
  const block = crypto.randomBytes(1 << 20);
  const fd = fs.openSync(src, 'w');
  for (let i = 0; i < fileMb; i++) fs.writeSync(fd, block);
  fs.closeSync(fd);
  try {
    // An upload's source is read from the cache on both sides (read again after each settle).
    const warm = () => pipeline(fs.createReadStream(src), fs.createWriteStream('/dev/null'));
    const files = `/v1/projects/${project}/boxes/${box}/files?path=`;
    const rawPath = path.join(rootfs, 'root', 'raw.bin');
    const cat = async (from: string, to: string) => {
      const t0 = nowMs();
      const r = await spawnCollect(['sh', '-c', 'cat "$1" > "$2"', 'cat', from, to]);
      if (r.code !== 0) throw new Error(`cat ${from} > ${to} failed: ${r.stderr}`);
      return nowMs() - t0;
    };
    // Every transfer starts from the same place on both sides: the kernel's dirty pages synced
    // and its page cache dropped (the storage's own cache, zfs-fuse's ARC, stays for both, and
    // `sync` does not make zfs-fuse commit its own transaction group), else raw cat reads memory.
    const settle = async () => {
      await spawnCollect(['sync']);
      await fs.promises.writeFile('/proc/sys/vm/drop_caches', '3').catch(() => undefined);
    };
    // One round first, kept by neither side: the first transfers of a fresh box pay once for
    // what later ones find made (the pool's space maps loaded, the api's code compiled), and
    // with three runs that round was the median's half (docs/decisions.md "The files figure").
    for (let i = -1; i < runs; i++) {
      const keep = (list: number[], ms: number) => void (i >= 0 && list.push(ms));
      await settle();
      await warm();
      keep(s.upload, await put(api, `${files}${encodeURIComponent('/root/api.bin')}`, src));
      await settle();
      await warm();
      keep(s.rawUpload, await cat(src, rawPath));
      await settle();
      keep(s.download, await get(api, `${files}${encodeURIComponent('/root/api.bin')}`));
      await settle();
      keep(s.rawDownload, await cat(rawPath, '/dev/null'));
    }
    fs.rmSync(rawPath, { force: true });
  } finally {
    fs.rmSync(src, { force: true });
  }
  return s;
}
