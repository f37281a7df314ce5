import net from 'node:net';
import { Readable } from 'node:stream';
import type { Lease } from '../../../core/bufferLease';
import type { ExecProcess } from '../../drivers';
import { BoxAgentUnavailableError } from '../../errors';
import { asAgentError, connectionError, failure, MAX_PID, requestOf } from './answers';
import { largeReadsInto } from './largeReads';
import { openExec } from './execSession';
import { BOXD_PROTOCOL, BoxdExecRequest, BoxdProtocolError, BoxFileInfo, DecodedFrame, encodeFrame, Frame, FrameDecoder, fileInfo, frameJson, intField, MAX_FRAME, textField, writeFrame } from './protocol';

/** How long boxd has to answer a request (a started, hello or ok frame). */
export const BOXD_ANSWER_TIMEOUT_MS = 10_000;

export interface BoxdHello {
  protocol: number;
  version: string;
  pid: number;
}

/** What a connection to boxd may hold unsent before its writer waits (a frame's worth). */
export const SOCKET_WRITE_BUFFER = MAX_FRAME;

/** The node's side of one box's boxd, reached through the socket the node made at start. */
export class BoxdClient {
  constructor(
    readonly socketPath: string,
    private readonly answerTimeoutMs = BOXD_ANSWER_TIMEOUT_MS,
  ) {}

  /**
   * One connection to boxd: `first` sent, every frame boxd sends handed to `onFrame`, and
   * everything that ends the exchange early (a failure frame, a socket error, a close, a frame
   * that breaks the protocol) handed to `fail` as the drivers' error. `streamed`: the frame
   * types handed on in pieces (FrameDecoder); `largeReads`: see largeReadsInto.
   */
  private exchange(first: Buffer, fail: (e: Error) => void, onFrame: (f: DecodedFrame, lease?: Lease) => void, opts: { streamed?: string[]; largeReads?: boolean } = {}): net.Socket {
    // A write answers "full" once what waits unsent passes the high-water mark, the piece just
    // written included: with Node's 16 KiB default every 64 KiB piece of an upload's body did,
    // and the body paused and resumed once per piece (4097 times for 256 MiB, a second of the
    // node's CPU). At most a frame's worth waits here, per upload (docs/decisions.md "Files at
    // stream speed"); the other requests write one frame and are unchanged by it.
    // (net.Socket hands its options to stream.Duplex; the typings leave the mark out.)
    const decoder = new FrameDecoder({ streamed: opts.streamed });
    const onChunk = (chunk: Buffer, lease?: Lease) => {
      try {
        for (const f of decoder.push(chunk)) {
          if (f.type === Frame.error) return fail(failure(frameJson(f), requestOf(first)));
          onFrame(f, lease);
        }
      } catch (e) {
        fail(asAgentError(e));
      }
    };
    const sockOpts: Record<string, unknown> = { writableHighWaterMark: SOCKET_WRITE_BUFFER };
    const reads = opts.largeReads ? largeReadsInto(onChunk, () => decoder.pending > 0) : null;
    if (reads) sockOpts.onread = reads;
    const sock = new net.Socket(sockOpts as net.SocketConstructorOpts).connect(this.socketPath);
    if (reads) sock.once('close', reads.end);
    let connected = false;
    sock.write(first); // queued until connected
    sock.on('connect', () => (connected = true));
    sock.on('error', (e: NodeJS.ErrnoException) => fail(connectionError(connected, e)));
    sock.on('close', () => fail(new BoxAgentUnavailableError('boxd closed the connection before the end of its answer')));
    sock.on('data', onChunk); // (a socket with `onread` emits no 'data': its callback has them)
    return sock;
  }

  /** One request whose answer is a single frame (`body`: frames sent after the request). */
  request(first: Buffer, want: string, body?: Readable, timeoutMs = this.answerTimeoutMs): Promise<DecodedFrame> {
    return new Promise((resolve, reject) => {
      let timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${timeoutMs} ms`)), timeoutMs);
      const done = (err: Error | null, f?: DecodedFrame) => {
        clearTimeout(timer);
        sock.destroy();
        if (err) reject(err);
        else resolve(f!);
      };
      const sock = this.exchange(first, done, (f) => {
        if (f.type !== want) throw new BoxdProtocolError(`boxd answered '${f.type}' to a request that wants '${want}'`);
        done(null, f);
      });
      if (body) {
        // Streamed as frames; the answer timer runs from the end of the body.
        clearTimeout(timer);
        body.on('error', (e) => done(e));
        // Read by hand, not `for await` (which destroys the body when it stops): once boxd has
        // answered (a failure mid-way: the box is full), the rest of the body is read and
        // dropped, so an HTTP client still sending gets its answer rather than a reset.
        const onData = (chunk: Buffer | string) => {
          if (sock.destroyed) return;
          const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk);
          let ok = true;
          for (let i = 0; i < b.length; i += MAX_FRAME) ok = writeFrame(sock, Frame.stdin, b.subarray(i, i + MAX_FRAME)) && ok;
          if (!ok) {
            body.pause();
            void drained(sock).then(() => body.resume());
          }
        };
        body.on('data', onData);
        body.once('end', () => {
          if (sock.destroyed) return;
          sock.write(encodeFrame(Frame.stdinEof));
          // From here a boxd that takes nothing more is wedged (what may still wait unsent, at
          // most SOCKET_WRITE_BUFFER, is milliseconds of a boxd's work).
          timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${timeoutMs} ms`)), timeoutMs);
        });
        sock.once('close', () => body.resume());
      }
    });
  }

  /** The answer timeout of this client (what a call waits for boxd beyond its own work). */
  get timeoutMs(): number {
    return this.answerTimeoutMs;
  }

  private helloOnce?: Promise<BoxdHello>;

  /** boxd's hello, asked once per client (a box's boxd keeps its version until the box
   *  restarts, when the runtime makes a new client). */
  knownHello(): Promise<BoxdHello> {
    this.helloOnce ??= this.hello().catch((e) => {
      this.helloOnce = undefined;
      throw e;
    });
    return this.helloOnce;
  }

  /** Whether this boxd resolves exec users itself (1.1.0 on: an older one ignores the field
   *  and would run the command as root). */
  async resolvesUsers(): Promise<boolean> {
    return this.atLeast(1, 1);
  }

  /** Whether this boxd is at least `major.minor` (its hello's version). */
  async atLeast(major: number, minor: number): Promise<boolean> {
    const [ma, mi] = (await this.knownHello()).version.split('.').map((n) => Number(n));
    return ma > major || (ma === major && mi >= minor);
  }

  async hello(): Promise<BoxdHello> {
    const o = frameJson(await this.request(encodeFrame(Frame.hello), Frame.helloReply));
    return { protocol: intField(o, 'protocol', 1, 1000), version: textField(o, 'version', 64), pid: intField(o, 'pid', 1, MAX_PID) };
  }

  /** Asks boxd to stop the box: SIGTERM to every process, PID 1 exits once they are gone or
   *  after `graceMs`. Resolves when boxd has taken the request. */
  async shutdown(graceMs: number): Promise<void> {
    await this.request(encodeFrame(Frame.shutdown, { v: BOXD_PROTOCOL, graceMs: Math.max(0, Math.round(graceMs)) }), Frame.ok);
  }

  // ------------------------------------------------------------ files (paths are the box's)

  async stat(path: string): Promise<BoxFileInfo> {
    return fileInfo(frameJson(await this.request(encodeFrame(Frame.stat, { v: BOXD_PROTOCOL, path }), Frame.answer)));
  }

  async list(path: string): Promise<{ entries: BoxFileInfo[]; truncated: boolean }> {
    const o = frameJson(await this.request(encodeFrame(Frame.list, { v: BOXD_PROTOCOL, path }), Frame.answer));
    if (!Array.isArray(o.entries)) throw new BoxAgentUnavailableError('boxd broke the protocol: a listing without entries');
    try {
      return { entries: o.entries.map((e) => fileInfo(e as Record<string, unknown>)), truncated: o.truncated === true };
    } catch (e) {
      throw asAgentError(e);
    }
  }

  /** Writes a whole file from `data` (streamed): a new file renamed over the old at the end,
   *  so a write that fails leaves the old file as it was. */
  async write(path: string, data: Readable | Buffer, opts: { mode?: number; parents?: boolean } = {}): Promise<BoxFileInfo> {
    const body = Buffer.isBuffer(data) ? Readable.from([data]) : data;
    return fileInfo(frameJson(await this.request(encodeFrame(Frame.write, { v: BOXD_PROTOCOL, path, mode: opts.mode, parents: opts.parents === true }), Frame.answer, body)));
  }

  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.request(encodeFrame(Frame.remove, { v: BOXD_PROTOCOL, path, recursive: opts.recursive === true }), Frame.ok);
  }

  async mkdir(path: string, opts: { mode?: number; parents?: boolean } = {}): Promise<BoxFileInfo> {
    return fileInfo(frameJson(await this.request(encodeFrame(Frame.mkdir, { v: BOXD_PROTOCOL, path, mode: opts.mode, parents: opts.parents === true }), Frame.answer)));
  }

  async chmod(path: string, mode: number): Promise<BoxFileInfo> {
    return fileInfo(frameJson(await this.request(encodeFrame(Frame.chmod, { v: BOXD_PROTOCOL, path, mode }), Frame.answer)));
  }

  /** Reads a file: its info once boxd has opened it, then its bytes streamed (back-pressure:
   *  boxd reads on only as fast as `data` is consumed). */
  async read(path: string): Promise<{ info: BoxFileInfo; data: Readable }> {
    // Large reads: a file streams in bulk. (A service's log follow does not: it may idle for
    // hours, and would hold a buffer of 1 MiB all that while.)
    const { head, data } = await this.openStream(encodeFrame(Frame.read, { v: BOXD_PROTOCOL, path }), fileInfo, { largeReads: true });
    return { info: head, data };
  }

  /**
   * A request answered by a head frame (`answer`, parsed by `parseHead`), then data frames until
   * an end frame; `data` has back-pressure (boxd sends on only as fast as it is consumed), and
   * destroying it ends the exchange (how a follow stops). `largeReads`: see largeReadsInto.
   */
  openStream<T>(first: Buffer, parseHead: (o: Record<string, unknown>) => T, opts: { largeReads?: boolean } = {}): Promise<{ head: T; data: Readable }> {
    return new Promise((resolve, reject) => {
      let head: { value: T } | null = null;
      let ended = false;
      const data = new Readable({
        highWaterMark: 1 << 20,
        read: () => sock.resume(),
        destroy: (err, cb) => {
          ended = true;
          sock.destroy();
          cb(err);
        },
      });
      const timer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
      const fail = (e: Error) => {
        clearTimeout(timer);
        if (ended) return;
        ended = true;
        sock.destroy();
        if (head) data.destroy(e);
        else reject(e);
      };
      const sock = this.exchange(first, fail, (f, lease) => {
        if (ended) return;
        if (!head) {
          if (f.type !== Frame.answer) throw new BoxdProtocolError(`boxd answered '${f.type}' where an answer frame belongs`);
          clearTimeout(timer);
          head = { value: parseHead(frameJson(f)) };
          resolve({ head: head.value, data });
        } else if (f.type === Frame.data) {
          // A piece of a pooled read is lent: a consumer that releases it (pipeReleasing) gives
          // the buffer back; one that does not leaves it to the collector.
          if (!data.push(lease ? lease.lend(f.payload) : f.payload)) sock.pause();
        } else if (f.type === Frame.end) {
          ended = true;
          data.push(null);
          sock.destroy();
        } else throw new BoxdProtocolError(`boxd sent '${f.type}' in a stream`);
      }, { streamed: [Frame.data], largeReads: opts.largeReads });
    });
  }

  /** A request answered by answer frames until an end frame (at most `max` of them). */
  async requestMany(first: Buffer, max: number): Promise<Record<string, unknown>[]> {
    return new Promise((resolve, reject) => {
      const out: Record<string, unknown>[] = [];
      let finished = false;
      const timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
      const done = (err: Error | null) => {
        clearTimeout(timer);
        if (finished) return;
        finished = true;
        sock.destroy();
        if (err) reject(err);
        else resolve(out);
      };
      const sock = this.exchange(first, done, (f) => {
        if (finished) return;
        if (f.type === Frame.end) return done(null);
        if (f.type !== Frame.answer) throw new BoxdProtocolError(`boxd sent '${f.type}' in a list`);
        if (out.length >= max) throw new BoxdProtocolError(`boxd sent more than ${max} answers`);
        out.push(frameJson(f));
      });
    });
  }

  /** Starts a detached process; its pid in the box. */
  async execDetached(req: BoxdExecRequest): Promise<number> {
    const o = frameJson(await this.request(encodeFrame(Frame.exec, { ...req, detach: true }), Frame.started));
    return intField(o, 'pid', 0, MAX_PID);
  }

  /**
   * Starts a process whose streams flow as it runs (see ExecProcess; execSession.ts). Aborting
   * `signal` kills the process and its group: exit code 137.
   */
  exec(req: BoxdExecRequest, signal?: AbortSignal): ExecProcess {
    return openExec(this.socketPath, this.answerTimeoutMs, req, signal);
  }
}

/** Resolves when the socket takes more writes, or closes (its listeners gone either way). */
function drained(sock: net.Socket): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      sock.off('drain', done);
      sock.off('close', done);
      resolve();
    };
    sock.on('drain', done);
    sock.on('close', done);
  });
}

