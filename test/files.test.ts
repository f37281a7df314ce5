import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { Readable } from 'node:stream';
import t from 'tap';
import { HttpNodeClient } from '../cluster/httpClient';
import { BoxhostError } from '../core/errors';
import { createLogger } from '../core/logger';
import { LocalNode } from '../workers/agent/localNode';
import { startAgent } from '../workers/agent/server';
import { createMockDrivers } from '../workers/mockDrivers';
import type { ContainerSpec } from '../workers/drivers';
import type { RuncRuntime } from '../workers/runtime/runc';
import { readBufferCounts } from '../workers/runtime/boxd/largeReads';
import { run } from '../core/command';
import { startTestHost, TestHost } from './helpers/host';

/**
 * The files API (DESIGN.md §4 "Files", docs/files.md): through a node's agent over HTTP (mock
 * drivers behind it: the transport), and on a real host end to end: round trips byte for byte,
 * every error's status, links that point out of the box (absolute, relative, swapped during the
 * calls) never reaching a host file, a full box leaving nothing behind, and the API's memory
 * flat while 1 GiB streams each way.
 */

const failure = async (p: Promise<unknown>): Promise<BoxhostError> => {
  try {
    await p;
  } catch (e) {
    return e as BoxhostError;
  }
  throw new Error('expected a failure');
};

t.test('through the node agent: HttpNodeClient ↔ LocalNode, streams and errors', async (t) => {
  const drivers = createMockDrivers();
  await drivers.runtime.start({ boxId: 'bx1', hostname: 'bx1', rootfs: '/nonexistent', netnsPath: '', cpus: 1, ramMb: 64, environment: {}, mounts: [] } as ContainerSpec);
  const local = new LocalNode('n1', drivers.runtime, drivers.storage);
  const secret = crypto.randomBytes(16).toString('hex');
  const agent = await startAgent({ node: local, secret, host: '127.0.0.1', port: 0, log: createLogger('silent'), holdsBox: async (id) => id === 'bx1' || id === 'bx2' });
  t.teardown(() => agent.close());
  const c = new HttpNodeClient('n1', agent.url, secret);

  const data = crypto.randomBytes(3 * 1024 * 1024 + 17);
  const st = await c.fileWrite('bx1', '/srv/app/blob.bin', Readable.from([data.subarray(0, 1000), data.subarray(1000)]), 0o600);
  t.same({ ...st, mtime: 'x' }, { name: 'blob.bin', path: '/srv/app/blob.bin', type: 'file', size: data.length, mode: '0600', mtime: 'x' }, 'the write answers the stat');
  const { stat, data: body } = await c.fileRead('bx1', '/srv/app/blob.bin');
  t.equal(stat.size, data.length, 'the read carries the stat');
  const chunks: Buffer[] = [];
  for await (const b of body) chunks.push(b as Buffer);
  t.ok(Buffer.concat(chunks).equals(data), '3 MiB round trip, byte for byte');
  t.same((await c.fileList('bx1', '/srv')).entries.map((e) => [e.name, e.path, e.type]), [['app', '/srv/app', 'dir']], 'list: names and full paths');
  t.equal((await c.fileStat('bx1', '/srv/app')).type, 'dir');

  t.equal((await failure(c.fileRead('bx1', '/nope'))).code, 'not_found', 'a missing file: not_found');
  t.equal((await failure(c.fileStat('bx1', '/nope'))).code, 'not_found');
  t.equal((await failure(c.fileRead('bx1', '/srv'))).code, 'invalid_argument', 'a directory where a file is wanted: invalid_argument');
  t.equal((await failure(c.fileDelete('bx1', '/srv', false))).code, 'invalid_argument', 'a directory that is not empty, without recursive');
  await c.fileDelete('bx1', '/srv', true);
  t.equal((await failure(c.fileStat('bx1', '/srv/app/blob.bin'))).code, 'not_found', 'recursive delete');
  t.equal((await failure(c.fileStat('bx2', '/'))).code, 'unavailable', 'a box whose container does not run (asked of the node: its row says it runs): unavailable, try again');
  t.equal((await failure(c.fileStat('other', '/'))).code, 'not_found', "another node's box: not_found");
  t.equal((await failure(c.fileStat('bx1', 'relative'))).code, 'invalid_argument', 'a relative path: invalid_argument');
});

/** Streams `total` bytes of a repeated pattern as an upload, hashing what it sent. */
async function upload(url: string, token: string, total: number): Promise<{ status: number; body: any; sha: string }> {
  const hash = crypto.createHash('sha256');
  const block = crypto.randomBytes(1 << 20);
  let sent = 0;
  const src = new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const b = block.subarray(0, Math.min(block.length, total - sent));
      sent += b.length;
      hash.update(b);
      this.push(b);
    },
  });
  const r = await putStream(url, token, src);
  return { ...r, sha: hash.digest('hex') };
}

/** PUTs `src` as the raw body, streamed; the status and the parsed answer. */
function putStream(url: string, token: string, src: Readable): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'PUT', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined });
      });
    });
    req.on('error', reject);
    src.pipe(req);
  });
}

/** Downloads, hashing and counting without keeping the bytes. */
async function download(url: string, token: string): Promise<{ status: number; bytes: number; sha: string }> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
  const hash = crypto.createHash('sha256');
  let bytes = 0;
  for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) {
    bytes += c.length;
    hash.update(c);
  }
  return { status: res.status, bytes, sha: hash.digest('hex') };
}

/** A host process's resident memory in bytes (0 once it is gone). */
function vmRss(pid: number): number {
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** The highest RSS of this process (the api runs in it) while `f` runs, above what it was; with
 *  `agentPid`, the same for that process (the box's boxd, seen from the host). */
async function rssGrowth<T>(f: () => Promise<T>, agentPid?: number): Promise<{ out: T; mib: number; agentMib: number }> {
  global.gc?.();
  const base = process.memoryUsage.rss();
  const agentBase = agentPid ? vmRss(agentPid) : 0;
  let peak = base;
  let agentPeak = agentBase;
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
    if (agentPid) agentPeak = Math.max(agentPeak, vmRss(agentPid));
  }, 50);
  try {
    const out = await f();
    return { out, mib: (peak - base) / (1 << 20), agentMib: (agentPeak - agentBase) / (1 << 20) };
  } finally {
    clearInterval(timer);
  }
}

t.test('on a real host', async (t) => {
  const host: TestHost = await startTestHost(t);
  const P = '/v1/projects/files/boxes';
  for (const [name, gb] of [['f', 2], ['small', 1]] as const) {
    t.equal((await host.call('POST', `${P}?wait=120`, { body: { name, config: { storage_gb: gb } } })).body.status, 'running', `box ${name} runs`);
  }
  const F = `${P}/f/files`;
  const q = (p: string) => `path=${encodeURIComponent(p)}`;
  const sh = async (box: string, script: string) => (await host.call('POST', `${P}/${box}/exec`, { body: { command: ['sh', '-c', script] } })).body;
  /** The host pid of a box's boxd (its PID 1). */
  const boxdPid = async (box: string): Promise<number> => {
    const runtime = host.node!.ctx.runtime as RuncRuntime;
    const id = (await host.call('GET', `${P}/${box}`)).body.id as string;
    return JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId(id)])).stdout).pid as number;
  };

  t.test('a 10 MiB random file round-trips byte for byte; stat, list, mode, delete', async (t) => {
    const data = crypto.randomBytes(10 * 1024 * 1024);
    const put = await host.call('PUT', `${F}?${q('/data/in/blob.bin')}&mode=0640`, { raw: data, contentType: 'application/octet-stream' });
    t.equal(put.status, 200, 'PUT 200');
    t.same({ ...put.body, mtime: 'x' }, { name: 'blob.bin', path: '/data/in/blob.bin', type: 'file', size: data.length, mode: '0640', mtime: 'x' }, 'answers the stat (parents made)');
    t.match(put.body.mtime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'mtime is RFC 3339 with milliseconds');
    const got = await download(`${host.url}${F}?${q('/data/in/blob.bin')}`, host.adminToken);
    t.equal(got.status, 200);
    t.equal(got.sha, crypto.createHash('sha256').update(data).digest('hex'), 'sha256 equal');
    t.equal((await sh('f', 'sha256sum /data/in/blob.bin')).stdout.split(' ')[0], got.sha, 'the box sees the same bytes');
    t.equal((await sh('f', 'stat -c %a /data/in/blob.bin')).stdout.trim(), '640', 'with its mode');
    const setuid = await host.call('PUT', `${F}?${q('/data/in/tool')}&mode=4755`, { raw: Buffer.from('#!/bin/sh\n'), contentType: 'application/octet-stream' });
    t.equal(setuid.body.mode, '4755', 'four digits: setuid kept in the mode (the root is nosuid: it grants nothing)');
    await sh('f', 'ln -s blob.bin /data/in/link');
    const list = await host.call('GET', `${F}/list?${q('/data/in')}`);
    t.same(list.body.entries.map((e: any) => [e.name, e.path, e.type, e.target]), [
      ['blob.bin', '/data/in/blob.bin', 'file', undefined],
      ['link', '/data/in/link', 'symlink', 'blob.bin'],
      ['tool', '/data/in/tool', 'file', undefined],
    ], 'list: every entry, links told with their target');
    t.equal(list.body.truncated, false);
    t.equal((await host.call('GET', `${F}/stat?${q('/data/in/link')}`)).body.type, 'symlink', 'stat does not follow a link');
    t.equal((await host.call('DELETE', `${F}?${q('/data/in')}`)).status, 400, 'a directory that is not empty, without recursive: 400');
    t.equal((await host.call('DELETE', `${F}?${q('/data/in')}&recursive=true`)).status, 204, 'recursive: 204');
    t.equal((await host.call('GET', `${F}/stat?${q('/data/in')}`)).status, 404, 'gone');
  });

  t.test('downloads use their read buffers again; a piece nobody gives back is never read over', async (t) => {
    // Four files of 24 MiB (different bytes) read at once, twice: a buffer used again while a
    // piece of it was still on its way would show in a hash.
    const files = Array.from({ length: 4 }, (_, i) => ({ path: `/root/pool-${i}.bin`, data: crypto.randomBytes(24 << 20) }));
    for (const f of files) t.equal((await host.call('PUT', `${F}?${q(f.path)}`, { raw: f.data, contentType: 'application/octet-stream' })).status, 200);
    const sha = (b: Buffer) => crypto.createHash('sha256').update(b).digest('hex');
    const before = readBufferCounts();
    for (let round = 0; round < 2; round++) {
      const got = await Promise.all(files.map((f) => download(`${host.url}${F}?${q(f.path)}`, host.adminToken)));
      got.forEach((g, i) => t.equal(g.sha, sha(files[i].data), `round ${round}, file ${i}: every byte as written`));
    }
    const after = readBufferCounts();
    const takes = after.made + after.reused - before.made - before.reused;
    t.ok(takes >= 100, `192 MiB read in large reads (${takes} buffers taken)`);
    t.ok(after.made - before.made <= 40, `most of them used again: ${after.made - before.made} allocated, ${after.reused - before.reused} reused`);

    // Control: a reader that keeps every piece and releases none (the node's fileRead, consumed
    // by hand). Its pieces stay as read while the other downloads go on: none is given back,
    // so none is read over.
    const node = host.node!.ctx.runtime as RuncRuntime;
    const id = (await host.call('GET', `${P}/f`)).body.id as string;
    const { data } = await (await node.files(id)).read(files[0].path);
    const kept: Buffer[] = [];
    // 'data' events hand on the pieces as pushed (an async iterator's read() may join them).
    // The first four pieces are held while four other downloads take buffers from the pool.
    const held = await new Promise<{ pieces: Buffer[]; bytes: Buffer } | null>((resolve, reject) => {
      let early: { pieces: Buffer[]; bytes: Buffer } | null = null;
      data.on('data', (c: Buffer) => {
        kept.push(c);
        if (kept.length !== 4) return;
        data.pause();
        const pieces = kept.slice();
        Promise.all(files.slice(1).map((f) => download(`${host.url}${F}?${q(f.path)}`, host.adminToken)))
          .then(() => {
            early = { pieces, bytes: Buffer.concat(pieces) };
            data.resume();
          })
          .catch(reject);
      });
      data.on('end', () => resolve(early));
      data.on('error', reject);
    });
    t.ok(held !== null, 'four pieces were held through the other downloads');
    t.ok(held!.pieces.some((c) => c.buffer.byteLength === 1 << 20), "control: some of them are views of the pool's 1 MiB buffers");
    t.ok(held!.bytes.equals(files[0].data.subarray(0, held!.bytes.length)), 'after the other downloads, they still hold the start of the file');
    t.equal(sha(Buffer.concat(kept)), sha(files[0].data), 'and every kept piece holds its part of the file');
    await sh('f', 'rm -f /root/pool-*.bin');
  });

  t.test("a read's connection to boxd holds up to 4 MiB in flight (boxd's send buffer)", async (t) => {
    // Larger than what loopback TCP and the api may take in while the client reads nothing.
    await host.call('PUT', `${F}?${q('/root/window.bin')}`, { raw: crypto.randomBytes(64 << 20), contentType: 'application/octet-stream' });
    const boxd = await boxdPid('f');
    // Each of boxd's unix sockets, listening one included (seen from the host: the node made it)
    // with its send buffer (`tb`) and what waits in it (`t`).
    const sockets = async () =>
      (await run(['ss', '-xampH'])).stdout
        .split('\n')
        .filter((l) => l.includes(`pid=${boxd},`))
        .map((l) => ({ tb: Number(/\btb(\d+)/.exec(l)?.[1] ?? 0), queued: Number(/\bt(\d+),tb/.exec(l)?.[1] ?? 0) }));
    // The kernel caps the ask (2 MiB) at net.core.wmem_max, then doubles it.
    const wmemMax = Number(fs.readFileSync('/proc/sys/net/core/wmem_max', 'utf8'));
    const want = 2 * Math.min(2 << 20, wmemMax);
    const before = await sockets();
    t.ok(before.length > 0, `control: boxd's sockets are seen (${before.length})`);
    t.ok(before.every((x) => x.tb < want), `control: none holds ${want} bytes before a read (${before.map((x) => x.tb).join(', ')})`);
    // A download whose client reads nothing: boxd fills what its connection holds.
    const req = http.get(`${host.url}${F}?${q('/root/window.bin')}`, { headers: { authorization: `Bearer ${host.adminToken}` } });
    t.teardown(() => req.destroy());
    await new Promise<void>((resolve, reject) => {
      req.on('response', (res) => {
        res.pause();
        resolve();
      });
      req.on('error', reject);
    });
    let during: { tb: number; queued: number }[] = [];
    for (let i = 0; i < 50; i++) {
      during = await sockets();
      if (during.some((x) => x.tb === want && x.queued > 0)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    t.ok(during.some((x) => x.tb === want && x.queued > 0), `the read's connection: a send buffer of ${want} bytes, in use (${JSON.stringify(during)})`);
    req.destroy();
  });

  t.test("an upload to the box's FUSE root is written O_DIRECT, elsewhere buffered; every size round-trips", async (t) => {
    const boxd = await boxdPid('f');
    // The flags of boxd's open temporary file for `name` (fdinfo, octal), seen from the host
    // while an upload waits half-way: its client sends 1 MiB, then holds the rest back.
    const flagsWhileUploading = async (p: string): Promise<number> => {
      const data = crypto.randomBytes(3 << 20);
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      const body = Readable.from((async function* () {
        yield data.subarray(0, 1 << 20);
        await held;
        yield data.subarray(1 << 20);
      })());
      const put = putStream(`${host.url}${F}?${q(p)}`, host.adminToken, body);
      const tmpName = `.${path.posix.basename(p)}.boxd-`;
      let flags = -1;
      try {
        for (let i = 0; i < 100 && flags < 0; i++) {
          for (const fd of fs.readdirSync(`/proc/${boxd}/fd`)) {
            const target = (() => { try { return fs.readlinkSync(`/proc/${boxd}/fd/${fd}`); } catch { return ''; } })();
            if (!path.posix.basename(target).startsWith(tmpName)) continue;
            // Read once a block is written (its position past 0): boxd sets O_DIRECT between
            // the open and the first write, and a look in between would see it not yet set.
            const info = fs.readFileSync(`/proc/${boxd}/fdinfo/${fd}`, 'utf8');
            if (Number(/^pos:\s+(\d+)$/m.exec(info)?.[1] ?? 0) > 0) flags = parseInt(/^flags:\s+([0-7]+)$/m.exec(info)![1], 8);
          }
          if (flags < 0) await new Promise((r) => setTimeout(r, 50));
        }
      } finally {
        release();
      }
      t.equal((await put).status, 200, `${p}: 200 once the rest is sent`);
      const got = await download(`${host.url}${F}?${q(p)}`, host.adminToken);
      t.equal(got.sha, crypto.createHash('sha256').update(data).digest('hex'), `${p}: the same bytes back`);
      return flags;
    };
    const { O_DIRECT } = fs.constants; // the architecture's own value (0o40000 on x86-64)
    const onRoot = await flagsWhileUploading('/root/direct.bin');
    t.ok(onRoot >= 0, `the temporary file is seen open in boxd, a block written (flags ${onRoot.toString(8)})`);
    t.ok(onRoot >= 0 && onRoot & O_DIRECT, 'on the FUSE root: O_DIRECT');
    const onTmpfs = await flagsWhileUploading('/dev/shm/buffered.bin');
    t.ok(onTmpfs >= 0, `control: seen on tmpfs too (flags ${onTmpfs.toString(8)})`);
    t.ok(onTmpfs >= 0 && !(onTmpfs & O_DIRECT), 'on tmpfs: buffered');
    await host.call('DELETE', `${F}?${q('/dev/shm/buffered.bin')}`);
    // Direct writes have no alignment rule on FUSE: a last block of any length, and the empty file.
    for (const size of [0, 1, 4095, 4097, (512 << 10) - 1, (512 << 10) + 1, (3 << 20) + 17]) {
      const data = crypto.randomBytes(size);
      const put = await host.call('PUT', `${F}?${q('/root/sized.bin')}`, { raw: data, contentType: 'application/octet-stream' });
      t.equal(put.body?.size, size, `${size} bytes: written`);
      const got = await download(`${host.url}${F}?${q('/root/sized.bin')}`, host.adminToken);
      t.ok(got.bytes === size && got.sha === crypto.createHash('sha256').update(data).digest('hex'), `${size} bytes: the same bytes back`);
    }
  });

  t.test('what boxd cannot splice is copied: /proc files read whole', async (t) => {
    // A regular file is sent by splice(2) (boxd/splice.go); most of /proc refuses it (EINVAL),
    // and is read into boxd instead. Both are the bytes the box reads itself.
    // /proc/1/stat: PID 1's pid and name (its times move on); /proc/meminfo: its first line.
    for (const [p, part] of [['/proc/1/stat', (s: string) => s.split(' ').slice(0, 2).join(' ')], ['/proc/meminfo', (s: string) => s.split('\n')[0]]] as const) {
      const got = await host.call('GET', `${F}?${q(p)}`);
      t.equal(got.status, 200, `${p}: 200`);
      const inBox = (await sh('f', `cat ${p}`)).stdout as string;
      t.ok(got.text.length > 20, `${p}: the whole file (${got.text.length} bytes)`);
      t.equal(part(got.text), part(inBox), `${p}: the box's own (${part(inBox)})`);
    }
  });

  t.test('errors: each with its status and the error body', async (t) => {
    const cases: Array<[string, string, string, number]> = [
      ['GET', F, `${q('/etc/nope')}`, 404],
      ['GET', `${F}/stat`, `${q('/etc/nope')}`, 404],
      ['GET', `${F}/list`, `${q('/etc/hostname')}`, 400],
      ['GET', F, `${q('/etc')}`, 400],
      ['GET', F, 'path=etc/hostname', 400],
      ['GET', F, '', 400],
      ['PUT', F, `${q('/etc')}`, 400],
      ['PUT', F, `${q('/etc/hostname/x')}`, 400],
      ['PUT', F, `${q('/tmp/x')}&mode=0999`, 400],
      ['DELETE', F, `${q('/')}`, 400],
      ['GET', `${P}/ghost/files`, `${q('/etc/hostname')}`, 404],
      ['PUT', F, `${q('/.boxhost/boxd')}`, 403],
      ['PUT', F, `${q('//./.boxhost/new')}`, 403],
      ['DELETE', F, `${q('/.boxhost/boxd')}`, 403],
      ['DELETE', F, `${q('/tmp/../.boxhost')}&recursive=true`, 403],
    ];
    for (const [method, base, query, status] of cases) {
      const r = await host.call(method, `${base}?${query}`, method === 'PUT' ? { raw: Buffer.from('x'), contentType: 'application/octet-stream' } : {});
      t.equal(r.status, status, `${method} ${base.slice(P.length)}?${decodeURIComponent(query)}: ${status}`);
      t.ok(typeof r.body?.error?.code === 'string' && Array.isArray(r.body.error.details), 'the error body');
      t.notMatch(r.text, /\/var\/tmp|\/run\/boxhost|bh-test/, 'no host path in it');
    }
    // A 404's message names the path once, in the box's terms.
    const missing = await host.call('GET', `${F}/stat?${q('/etc/nope')}`);
    t.notMatch(missing.body.error.message, /not found/, `the agent's own words (${missing.body.error.message})`);
    t.match(missing.body.error.message, /\/etc\/nope: no such file or directory$/);
    // The agent is still there and serving, and reading it is allowed.
    const agent = await host.call('GET', `${F}/stat?${q('/.boxhost/boxd')}`);
    t.equal(agent.status, 200, agent.text);
    // A mount point in use, reached through a link the kernel follows in the box: 409, not the
    // agent reported down (a rename over a bind-mounted file is EBUSY).
    t.equal((await host.call('POST', `${P}/f/exec`, { body: { command: ['ln', '-sfn', '/.boxhost', '/tmp/agentdir'] } })).body.exit_code, 0);
    const busy = await host.call('PUT', `${F}?${q('/tmp/agentdir/boxd')}`, { raw: Buffer.from('x'), contentType: 'application/octet-stream' });
    t.ok(busy.status === 409 || busy.status === 403, `a write over the agent through a link: ${busy.status} (${busy.text.slice(0, 160)})`);
    t.not(busy.status, 503, 'not "the agent is not answering"');
    t.equal((await host.call('POST', `${P}/f/exec`, { body: { command: ['true'] } })).body.exit_code, 0, 'the box still serves');
    // A path whose escapes are broken is refused, not written under its raw text.
    for (const query of ['path=/tmp/a%zzb', 'path=/tmp/%C3%28', 'path=/tmp/x&mode=%']) {
      const r = await host.call('PUT', `${F}?${query}`, { raw: Buffer.from('x'), contentType: 'application/octet-stream' });
      t.equal(r.status, 400, `PUT ?${query}: 400`);
      t.same(r.body?.error?.details, [{ field: 'query', issue: 'is not valid percent-encoded UTF-8' }]);
    }
    const tmp = (await host.call('GET', `${F}/list?${q('/tmp')}`)).body.entries.map((e: any) => e.name);
    t.same(tmp.filter((n: string) => /%|a.zzb|\(|^x$/.test(n)), [], `nothing written for them (/tmp holds ${JSON.stringify(tmp)})`);
  });

  t.test('links out of the box never reach a host file', async (t) => {
    const dir = fs.mkdtempSync('/var/tmp/bh-probe-files-');
    t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
    const marker = path.join(dir, 'secret');
    fs.writeFileSync(marker, 'HOST-SECRET\n');
    const depth = '../'.repeat(12);
    await sh('f', `mkdir -p /esc && ln -s ${marker} /esc/abs && ln -s ${depth}${marker.slice(1)} /esc/rel && ln -s ${dir} /esc/dir && mkdir -p /esc/real`);
    for (const link of ['/esc/abs', '/esc/rel', '/esc/dir/secret']) {
      const r = await host.call('GET', `${F}?${q(link)}`);
      t.equal(r.status, 404, `GET ${link}: 404 (it names ${marker} in the box, which has none)`);
      t.notMatch(r.text, /HOST-SECRET/);
    }
    for (const link of ['/esc/abs', '/esc/rel']) {
      const r = await host.call('PUT', `${F}?${q(link)}`, { raw: Buffer.from('OVERWRITTEN\n'), contentType: 'application/octet-stream' });
      t.equal(r.status, 200, `PUT ${link}: the link replaced by the file, in the box`);
    }
    const through = await host.call('PUT', `${F}?${q('/esc/dir/secret')}`, { raw: Buffer.from('OVERWRITTEN\n'), contentType: 'application/octet-stream' });
    t.equal(through.status, 409, 'PUT through a link to a directory the box does not have: 409 (a link stands where a directory is needed)');
    await sh('f', `mkdir -p ${dir} && echo inbox > ${marker}`);
    const into = await host.call('PUT', `${F}?${q('/esc/dir/secret')}`, { raw: Buffer.from('OVERWRITTEN\n'), contentType: 'application/octet-stream' });
    t.equal(into.status, 200, "once the box has that directory, the write goes through the link into the box's own");
    t.equal(fs.readFileSync(marker, 'utf8'), 'HOST-SECRET\n', 'the host file is untouched');
    t.equal((await sh('f', `cat ${marker}`)).stdout, 'OVERWRITTEN\n', 'the write landed at that path inside the box');

    // A link swapped between a box directory and the root while the calls run.
    await sh('f', `echo inside > /esc/real/secret; mkdir -p /esc/sw; (for i in $(seq 1 3000); do ln -sfn /esc/real /esc/sw/d; ln -sfn ${dir} /esc/sw/d; done) >/dev/null 2>&1 &`);
    let leaked = 0;
    let served = 0;
    for (let i = 0; i < 40; i++) {
      const r = await host.call('GET', `${F}?${q('/esc/sw/d/secret')}`);
      if (/HOST-SECRET/.test(r.text)) leaked++;
      if (r.status === 200) served++;
      await host.call('PUT', `${F}?${q('/esc/sw/d/secret')}`, { raw: Buffer.from('RACE\n'), contentType: 'application/octet-stream' });
    }
    t.equal(leaked, 0, `40 reads during the swaps: the host file never read (${served} served from the box)`);
    t.equal(fs.readFileSync(marker, 'utf8'), 'HOST-SECRET\n', '40 writes during the swaps: the host file never written');
    t.same(fs.readdirSync(dir).sort(), ['secret'], 'nothing new in the host directory');
  });

  t.test('a full box: 507, nothing left at the path; 1 GiB each way with the API memory flat', async (t) => {
    const S = `${P}/small/files`;
    await host.call('PUT', `${S}?${q('/root/keep')}`, { raw: Buffer.from('old\n'), contentType: 'application/octet-stream' });
    const over = await rssGrowth(() => upload(`${host.url}${S}?${q('/root/keep')}`, host.adminToken, 1200 * 1024 * 1024));
    t.equal(over.out.status, 507, `1200 MiB into a 1 GB box: 507 (${over.out.body?.error?.code})`);
    t.equal(over.out.body?.error?.code, 'insufficient_storage');
    t.equal((await sh('small', 'cat /root/keep; ls -a /root | grep -c boxd || true')).stdout, 'old\n0\n', 'the old file as it was, no temporary left');
    t.comment(`upload of 1200 MiB until the box was full: API RSS grew ${over.mib.toFixed(0)} MiB at most`);

    // boxd, the box's PID 1, seen from the host.
    const boxd = await boxdPid('f');
    t.ok(vmRss(boxd) > 0, `control: boxd's memory is readable from the host (pid ${boxd}, ${(vmRss(boxd) / (1 << 20)).toFixed(1)} MiB)`);
    const up = await rssGrowth(() => upload(`${host.url}${F}?${q('/root/big')}`, host.adminToken, 1024 * 1024 * 1024), boxd);
    t.equal(up.out.status, 200, '1 GiB upload: 200');
    t.equal(up.out.body.size, 1024 * 1024 * 1024);
    const down = await rssGrowth(() => download(`${host.url}${F}?${q('/root/big')}`, host.adminToken), boxd);
    t.equal(down.out.bytes, 1024 * 1024 * 1024, '1 GiB download: every byte');
    t.equal(down.out.sha, up.out.sha, 'the same bytes');
    t.comment(`1 GiB: API RSS grew ${up.mib.toFixed(0)} MiB uploading, ${down.mib.toFixed(0)} MiB downloading`);
    for (const [what, mib] of [['upload', up.mib], ['download', down.mib], ['full upload', over.mib]] as const) t.ok(mib < 160, `${what}: the API's RSS stays within 160 MiB of where it was (${mib.toFixed(0)})`);
    t.comment(`1 GiB: boxd RSS grew ${up.agentMib.toFixed(1)} MiB uploading, ${down.agentMib.toFixed(1)} MiB downloading`);
    for (const [what, mib] of [['upload', up.agentMib], ['download', down.agentMib]] as const) t.ok(mib < 32, `${what}: boxd's RSS stays within 32 MiB of where it was (${mib.toFixed(1)})`);
  });

  t.test('a stopped box: 409', async (t) => {
    t.equal((await host.call('POST', `${P}/small/stop?wait=60`)).body.status, 'stopped');
    const r = await host.call('GET', `${P}/small/files/stat?${q('/')}`);
    t.equal(r.status, 409);
    t.equal(r.body.error.code, 'conflict');
  });
});
