import t from 'tap';
import { release } from '../core/bufferLease';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { BoxdClient, SOCKET_WRITE_BUFFER } from '../workers/runtime/boxd/client';
import { largeReadsInto } from '../workers/runtime/boxd/largeReads';
import { BoxdServices } from '../workers/runtime/boxd/services';
import { BoxdProtocolError, encodeFrame, Frame, FrameDecoder, MAX_FRAME } from '../workers/runtime/boxd/protocol';
import { BoxAgentUnavailableError, BoxServiceError, ExecInputError } from '../workers/errors';

/** The node's side of the boxd protocol against what a hostile or broken boxd could send. */

t.test('frames: round trip, split anywhere', async (t) => {
  const frames = [encodeFrame(Frame.started, { pid: 7 }), encodeFrame(Frame.stdout, Buffer.from('hello')), encodeFrame(Frame.exit, { code: 0 })];
  const all = Buffer.concat(frames);
  for (let cut = 0; cut <= all.length; cut++) {
    const d = new FrameDecoder();
    const got = [...d.push(all.subarray(0, cut)), ...d.push(all.subarray(cut))];
    t.same(got.map((f) => f.type), ['s', 'o', 'x'], `cut at ${cut}`);
    if (cut === 7) t.equal(got[1].payload.toString(), 'hello');
  }
  t.throws(() => encodeFrame(Frame.stdout, Buffer.alloc(MAX_FRAME + 1)), RangeError);
});

t.test('streamed frames: a byte stream handed on in pieces as it arrives, the same bytes, nothing buffered', async (t) => {
  const big = crypto.randomBytes(300_000);
  const all = Buffer.concat([encodeFrame(Frame.answer, { size: 1 }), encodeFrame(Frame.data, big), encodeFrame(Frame.data, Buffer.from('tail')), encodeFrame(Frame.end)]);
  for (const piece of [3, 7, 4096, 65536, all.length]) {
    const d = new FrameDecoder({ streamed: [Frame.data] });
    const got: { type: string; payload: Buffer }[] = [];
    let held = 0;
    for (let at = 0; at < all.length; at += piece) {
      got.push(...d.push(all.subarray(at, at + piece)));
      held = Math.max(held, d.pending);
    }
    t.ok(held <= 5 + 64, `never more than a header and a small frame held (pieces of ${piece}: ${held})`);
    t.same(got.map((f) => f.type).filter((x, i, a) => a[i - 1] !== x), ['a', 'd', 'z'], `types in order (pieces of ${piece})`);
    const data = Buffer.concat(got.filter((f) => f.type === Frame.data).map((f) => f.payload));
    t.ok(data.equals(Buffer.concat([big, Buffer.from('tail')])), `the bytes, whole and in order (pieces of ${piece})`);
    if (piece === 65536) t.ok(got.filter((f) => f.type === Frame.data).length > 2, 'handed on before the frame was whole');
  }
  // A frame type not streamed is still whole, and a streamed frame's length is still bounded.
  const d = new FrameDecoder({ streamed: [Frame.data] });
  const out = d.push(encodeFrame(Frame.stdout, Buffer.alloc(100_000)).subarray(0, 50_000));
  t.equal(out.length, 0, 'stdout is not streamed unless asked');
  t.throws(() => new FrameDecoder({ streamed: [Frame.data] }).push(Buffer.from([0x64, 0x7f, 0xff, 0xff, 0xff])), BoxdProtocolError, 'a huge streamed frame is refused');
});

t.test('decoder fuzz: only frames or BoxdProtocolError, never more than a frame buffered', async (t) => {
  let frames = 0;
  let refused = 0;
  for (let i = 0; i < 5000; i++) {
    const d = new FrameDecoder();
    const bytes = crypto.randomBytes(crypto.randomInt(1, 200));
    if (i % 2 === 0) {
      // A known type and a length that fits what follows, most of the time.
      bytes[0] = 'soexfyv'.charCodeAt(crypto.randomInt(7));
      if (bytes.length >= 5) bytes.writeUInt32BE(crypto.randomInt(0, bytes.length), 1);
    }
    try {
      for (let at = 0; at < bytes.length; ) {
        const n = crypto.randomInt(1, 20);
        frames += d.push(bytes.subarray(at, at + n)).length;
        at += n;
      }
      if (d.pending > 5 + MAX_FRAME) t.fail('buffered past a frame');
    } catch (e) {
      if (!(e instanceof BoxdProtocolError)) throw e;
      refused++;
    }
  }
  t.ok(refused > 0 && frames > 0, `${frames} frames decoded, ${refused} streams refused`);
  const d = new FrameDecoder();
  t.throws(() => d.push(Buffer.from([0x6f, 0x7f, 0xff, 0xff, 0xff])), BoxdProtocolError, 'a huge length is refused before it is buffered');
});

/** A fake boxd on a real unix socket that answers every connection with `reply`. */
async function fakeBoxd(reply: (c: net.Socket) => void): Promise<{ sock: string; close: () => void }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-probe-boxd-'));
  const sock = path.join(dir, 'boxd.sock');
  const server = net.createServer((c) => {
    c.on('error', () => undefined);
    c.once('data', () => reply(c));
  });
  await new Promise<void>((r) => server.listen(sock, r));
  return { sock, close: () => (server.close(), fs.rmSync(dir, { recursive: true, force: true })) };
}

const req = { v: 1, argv: ['true'], env: [], cwd: '/', uid: 0, gid: 0, groups: [], tty: false, echo: false, cols: 80, rows: 24, stdin: false, detach: false, timeoutMs: 0 };

t.test('client: what boxd may answer, and what it may not', async (t) => {
  const cases: { name: string; send: Buffer; want: RegExp | 'ok' | typeof ExecInputError }[] = [
    { name: 'a normal exec', send: Buffer.concat([encodeFrame(Frame.started, { pid: 5 }), encodeFrame(Frame.stdout, 'hi'), encodeFrame(Frame.exit, { code: 3 })]), want: 'ok' },
    { name: 'a cwd failure', send: encodeFrame(Frame.error, { kind: 'cwd', message: 'nope' }), want: ExecInputError },
    { name: 'an unknown frame type', send: Buffer.from([0x21, 0, 0, 0, 0]), want: /broke the protocol/ },
    { name: 'a request type from boxd', send: encodeFrame(Frame.stdin, 'x'), want: /broke the protocol/ },
    { name: 'an exit code out of range', send: encodeFrame(Frame.exit, { code: 99999 }), want: /broke the protocol/ },
    { name: 'a pid that is a string', send: encodeFrame(Frame.started, { pid: '1; rm -rf /' }), want: /broke the protocol/ },
    { name: 'an exit that is not JSON', send: encodeFrame(Frame.exit, 'exit'), want: /broke the protocol/ },
    { name: 'a huge frame', send: Buffer.from([0x6f, 0xff, 0xff, 0xff, 0xff]), want: /broke the protocol/ },
    { name: 'a close mid-way', send: encodeFrame(Frame.started, { pid: 5 }).subarray(0, 7), want: /closed the connection/ },
  ];
  for (const c of cases) {
    const fake = await fakeBoxd((s) => s.end(c.send));
    const p = new BoxdClient(fake.sock, 2000).exec(req);
    p.stdout.resume();
    p.stderr.resume();
    if (c.want === 'ok') t.same(await p.exited, { exitCode: 3, timedOut: false }, c.name);
    else if (c.want === ExecInputError) await t.rejects(p.exited, ExecInputError, c.name);
    else await t.rejects(p.exited, c.want as RegExp, c.name);
    if (c.want !== 'ok' && c.want !== ExecInputError) await t.rejects(p.exited, BoxAgentUnavailableError, `${c.name}: 503, the agent`);
    fake.close();
  }
  // Failure messages are shown to users: bounded, no control bytes.
  const fake = await fakeBoxd((s) => s.end(encodeFrame(Frame.error, { kind: 'input', field: 'evil', message: `\u001b[31m${'x'.repeat(5000)}` })));
  const err = await new BoxdClient(fake.sock, 2000).exec(req).exited.catch((e: ExecInputError) => e);
  t.type(err, ExecInputError);
  t.equal((err as ExecInputError).field, 'command', 'an unknown field is not believed');
  t.ok((err as Error).message.length <= 500 && !(err as Error).message.includes('\u001b'), 'bounded and clean');
  fake.close();
  // Random garbage from boxd never throws out of the client, and always settles.
  for (let i = 0; i < 200; i++) {
    const junk = crypto.randomBytes(crypto.randomInt(1, 300));
    if (i % 2) junk[0] = 'soexfyv'.charCodeAt(crypto.randomInt(7));
    const f = await fakeBoxd((s) => s.end(junk));
    const p = new BoxdClient(f.sock, 1000).exec(req);
    p.stdout.resume();
    p.stderr.resume();
    await p.exited.then(
      () => undefined,
      (e) => (e instanceof BoxAgentUnavailableError || e instanceof ExecInputError ? undefined : t.fail(`unexpected ${e}`)),
    );
    f.close();
  }
  t.pass('200 garbage answers settled as results or agent errors');
});

t.test("the node does not believe boxd's service answers", async (t) => {
  const state = { name: 'web', state: 'running', pid: 7, restarts: 0 };
  const cases: Array<[string, Buffer, string]> = [
    ['a state that is not one', encodeFrame(Frame.answer, { ...state, state: 'exploded' }), 'get'],
    ['a name that is not one', encodeFrame(Frame.answer, { ...state, name: '../../etc' }), 'get'],
    ['a pid out of range', encodeFrame(Frame.answer, { ...state, pid: -4 }), 'get'],
    ['an exit code out of range', encodeFrame(Frame.answer, { ...state, last_exit_code: 9999 }), 'get'],
    ['a spec that is not an object', encodeFrame(Frame.answer, { ...state, spec: 'rm -rf /' }), 'get'],
    ['a start answer without its service', encodeFrame(Frame.answer, { replaced: true }), 'start'],
    ['a list that never ends', Buffer.concat([encodeFrame(Frame.answer, state), encodeFrame(Frame.stdout, 'x')]), 'list'],
  ];
  for (const [what, reply, op] of cases) {
    const fake = await fakeBoxd((s) => s.end(reply));
    const svcs = new BoxdServices(new BoxdClient(fake.sock, 1000));
    const call: Promise<unknown> = op === 'get' ? svcs.get('web') : op === 'start' ? svcs.start({ name: 'web', command: ['true'] }) : svcs.list();
    await t.rejects(call, BoxAgentUnavailableError, `${what}: 503, the agent`);
    fake.close();
  }
  const fake = await fakeBoxd((s) => s.end(encodeFrame(Frame.error, { kind: 'not_found', field: 'name', message: 'no service "web" in the box' })));
  await t.rejects(new BoxdServices(new BoxdClient(fake.sock, 1000)).get('web'), BoxServiceError, 'not found is a service error (404)');
  fake.close();
  const ok = await fakeBoxd((s) => s.end(encodeFrame(Frame.answer, { ...state, last_exit_code: 3, spec: { name: 'web' } })));
  t.same(await new BoxdServices(new BoxdClient(ok.sock, 1000)).get('web'), { name: 'web', state: 'running', pid: 7, restarts: 0, lastExitCode: 3, spec: { name: 'web' } }, 'a good answer, read field by field');
  ok.close();
});

t.test('a boxd from before 1.1.0 is not asked to resolve a user (it would ignore the field and run as root)', async (t) => {
  for (const [version, resolves] of [['1.0.0', false], ['1.1.0', true], ['2.0.0', true]] as const) {
    const fake = await fakeBoxd((s) => s.end(encodeFrame(Frame.helloReply, { protocol: 1, version, pid: 1 })));
    t.equal(await new BoxdClient(fake.sock, 1000).resolvesUsers(), resolves, `${version}: ${resolves ? 'resolves users itself' : 'the node resolves them'}`);
    fake.close();
  }
});

/** A body of `pieces` × 64 KiB, as an HTTP upload arrives; counts how often the writer paused it
 *  and how many bytes were taken from it. */
function uploadBody(pieces: number) {
  const piece = Buffer.alloc(64 << 10, 7);
  const stats = { pauses: 0, taken: 0 };
  let left = pieces;
  const body = new Readable({
    read() {
      if (left-- <= 0) return void this.push(null);
      stats.taken += piece.length;
      this.push(piece);
    },
  });
  const pause = body.pause.bind(body);
  body.pause = () => {
    if (!body.isPaused()) stats.pauses++;
    return pause();
  };
  return { body, stats };
}

/** A fake boxd for uploads: reads the request frame and the body's frames as boxd does (a
 *  header, then the payload), answering the file's info at the end; `takes: false` reads nothing. */
async function uploadBoxd(takes: boolean): Promise<{ sock: string; received: () => number; close: () => void }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bh-probe-boxd-'));
  const sock = path.join(dir, 'boxd.sock');
  const conns = new Set<net.Socket>();
  let received = 0;
  const server = net.createServer((c) => {
    conns.add(c);
    c.on('error', () => undefined);
    if (!takes) return void c.pause();
    let buf = Buffer.alloc(0);
    let first = true;
    c.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
        const type = String.fromCharCode(buf[0]);
        const size = buf.readUInt32BE(1);
        buf = buf.subarray(5 + size);
        if (first) first = false; // the write request
        else if (type === Frame.stdin) received += size;
        else if (type === Frame.stdinEof) c.end(encodeFrame(Frame.answer, { name: 'f', type: 'file', size: received, mode: 0o644, mtime: '2026-11-28T00:00:00Z', uid: 0, gid: 0 }));
      }
    });
  });
  await new Promise<void>((r) => server.listen(sock, r));
  return {
    sock,
    received: () => received,
    close: () => {
      for (const c of conns) c.destroy();
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

t.test('an upload streams to boxd without pausing its body for every piece, and holds at most its window', async (t) => {
  const fake = await uploadBoxd(true);
  const { body, stats } = uploadBody(128); // 8 MiB
  const info = await new BoxdClient(fake.sock, 5000).write('/f', body);
  t.equal(info.size, 8 << 20, 'every byte arrived');
  t.equal(fake.received(), 8 << 20);
  // With Node's default 16 KiB mark each 64 KiB piece answered "full": 128 pauses.
  t.ok(stats.pauses <= 32, `the body paused ${stats.pauses} times for 128 pieces (only when boxd is behind)`);
  fake.close();

  // A boxd that takes nothing: the node stops taking the body once its window is full.
  const stuck = await uploadBoxd(false);
  const slow = uploadBody(1024); // 64 MiB, were it all taken
  const call = new BoxdClient(stuck.sock, 5000).write('/f', slow.body).catch((e: Error) => e);
  await new Promise((r) => setTimeout(r, 500));
  // The kernel's socket buffers, the node's mark, and what the body's own stream holds.
  const bound = 8 * SOCKET_WRITE_BUFFER;
  t.ok(slow.stats.taken <= bound, `${slow.stats.taken} bytes taken from the body while boxd took none (at most ${bound})`);
  t.ok(slow.stats.pauses >= 1, 'the body is paused');
  stuck.close();
  t.type(await call, BoxAgentUnavailableError, 'and the upload fails as the agent gone once boxd is');
  slow.body.destroy();
});

/** A fake boxd for reads: answers the request with a file's info, then sends `frames` (data
 *  frames of the given sizes, `gapMs` apart), then the end frame. Returns what it sent. */
async function readBoxd(frames: number[], gapMs: number): Promise<{ sock: string; sent: Buffer; close: () => void }> {
  const sent = crypto.randomBytes(frames.reduce((a, b) => a + b, 0));
  const fake = await fakeBoxd(async (c) => {
    c.write(encodeFrame(Frame.answer, { name: 'f', type: 'file', size: sent.length, mode: 0o644, mtime: '2026-11-29T00:00:00Z', uid: 0, gid: 0 }));
    let at = 0;
    for (const n of frames) {
      if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
      const ok = c.write(encodeFrame(Frame.data, sent.subarray(at, at + n)));
      at += n;
      if (!ok) await new Promise((r) => c.once('drain', r));
    }
    c.end(encodeFrame(Frame.end));
  });
  return { ...fake, sent };
}

t.test("a file read's socket is read in large pieces; a trickle does not pin a large buffer per piece", async (t) => {
  // In bulk: 16 frames of 512 KiB as fast as the socket takes them.
  const bulk = await readBoxd(Array(16).fill(512 << 10), 0);
  const { data } = await new BoxdClient(bulk.sock, 5000).read('/f');
  const chunks: Buffer[] = [];
  for await (const c of data) chunks.push(c as Buffer);
  t.ok(Buffer.concat(chunks).equals(bulk.sent), '8 MiB, byte for byte');
  const largest = Math.max(...chunks.map((c) => c.length));
  // Node reads a socket 64 KiB at a time unless told otherwise.
  t.ok(largest > 64 << 10, `pieces larger than a socket's default 64 KiB read (largest ${largest} bytes, ${chunks.length} pieces)`);
  bulk.close();

  // A trickle: 20 frames of 1 KiB, 5 ms apart; each piece is its own size, not a 1 MiB buffer's.
  const slow = await readBoxd(Array(20).fill(1024), 5);
  const r = await new BoxdClient(slow.sock, 5000).read('/f');
  const small: Buffer[] = [];
  for await (const c of r.data) small.push(c as Buffer);
  t.ok(Buffer.concat(small).equals(slow.sent), '20 KiB, byte for byte');
  const held = Math.max(...small.map((c) => c.buffer.byteLength));
  t.ok(held < 64 << 10, `each small piece holds at most ${held} bytes of memory (its own size, or Node's pool)`);
  slow.close();
});

t.test('a large read\'s buffer serves the next read once its pieces are back, never while the decoder holds bytes of it', async (t) => {
  const got: Buffer[] = [];
  let keeps = false;
  const reads = largeReadsInto((chunk, lease) => void got.push(lease ? lease.lend(chunk) : chunk), () => keeps);
  // A read that ends on a frame's end: its piece released, the buffer is the next read's.
  const b1 = reads.buffer();
  reads.callback(600 << 10, b1);
  t.equal(got[0].buffer, b1.buffer, 'the piece is a view of the read buffer (lent, not copied)');
  const b2 = reads.buffer();
  t.not(b2, b1, 'a piece still out: the next read takes another buffer');
  release(got[0]);
  reads.callback(600 << 10, b2);
  release(got[1]);
  t.equal(reads.buffer(), b2, 'every piece back: the buffer is used again');
  // A read that ends inside a frame (a header cut in two): the decoder keeps its tail.
  keeps = true;
  const b3 = reads.buffer();
  reads.callback(600 << 10, b3);
  release(got[2]);
  const b4 = reads.buffer();
  t.not(b4, b3, 'the decoder still refers to it: another buffer is taken');
  reads.callback(600 << 10, b4);
  release(got[3]);
  t.not(reads.buffer(), b3, 'and that buffer never comes back');
  // A short read is copied out; its buffer stays the socket's.
  keeps = false;
  const b5 = reads.buffer();
  reads.callback(100, b5);
  t.not(got[4].buffer, b5.buffer, 'a short read goes on as a copy');
  t.equal(reads.buffer(), b5, 'the same buffer is read into next');
  reads.end();
});
