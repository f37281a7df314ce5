import net from 'node:net';
import os from 'node:os';
import { Readable, Writable } from 'node:stream';
import { BufferPool, type Lease } from '../../../core/bufferLease';
import { EXEC_LET_GO, type ExecProcess } from '../../drivers';
import { BoxAgentUnavailableError, BoxFileError, BoxServiceError, ExecInputError } from '../../errors';
import { BOXD_PROTOCOL, BoxdExecRequest, BoxdProtocolError, BoxFileInfo, DecodedFrame, encodeFrame, Frame, FrameDecoder, fileInfo, frameJson, intField, MAX_FRAME, STDIN_FRAME, STDIN_WINDOW, textField, writeFrame } from './protocol';

/** How long boxd has to answer a request (a started, hello or ok frame). */
export const BOXD_ANSWER_TIMEOUT_MS = 10_000;
/** Past an exec's own timeout, how long boxd has to report the kill before it counts as wedged. */
const TIMEOUT_GRACE_MS = 10_000;
/** After an abort, how long boxd has to report the kill before the exec is given up on. */
const ABORT_GRACE_MS = 5_000;
/** The largest pid a Linux pid namespace hands out. */
const MAX_PID = 4_194_304;

/** A connection to boxd failed before it was made (no socket, nobody listening). */
export class BoxdUnreachableError extends BoxAgentUnavailableError {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

export interface BoxdHello {
  protocol: number;
  version: string;
  pid: number;
}

/** What a connection to boxd may hold unsent before its writer waits (a frame's worth). */
export const SOCKET_WRITE_BUFFER = MAX_FRAME;

/** A file read's socket is read up to LARGE_READ at a time (boxd holds up to 4 MiB in flight on
 *  it); a read shorter than KEEP_READ is copied out and its buffer used again, so a piece
 *  handed on never holds more than twice its size. */
const LARGE_READ = 1 << 20;
const KEEP_READ = LARGE_READ / 2;
/** The read buffers of every file read of this process, 16 MiB of them kept idle at most. */
const readPool = new BufferPool(LARGE_READ, 16);

/** How the file reads' buffers were had: allocated, or used again (tests, diagnostics). */
export function readBufferCounts(): { made: number; reused: number; idle: number } {
  return { made: readPool.made, reused: readPool.reused, idle: readPool.idleCount };
}

/**
 * Reads of a file's stream, up to 1 MiB at a time into buffers of the node's own (net.Socket's
 * `onread`), where a socket's reads are 64 KiB each: a 256 MiB download took 4096 reads, 4096
 * stream pushes and 4096 writes to the client's socket, and the node's CPU for it halved with
 * 1 MiB reads (docs/decisions.md "A file read's socket is read 1 MiB at a time"). A read of
 * half a buffer or more is handed on in place: `onChunk` gets its lease, to lend the pieces it
 * hands on (core/bufferLease.ts), and the buffer comes back to the pool once they are all
 * released (docs/decisions.md "Download buffers are used again"). A shorter one (a slow
 * reader, the head frame, the tail) is copied out at its size and the buffer kept, so a
 * trickle does not pin 1 MiB per piece. `keeps()`: whether the decoder still holds bytes of
 * the last read (a frame begun), which then must not be read over. (Exported for its tests.)
 */
export function largeReadsInto(onChunk: (b: Buffer, lease?: Lease) => void, keeps: () => boolean): { buffer: () => Buffer; callback: (n: number, b: Buffer) => void; end: () => void } {
  let next: Lease | null = null;
  return {
    buffer: () => (next ??= readPool.take()).buffer,
    callback: (n, b) => {
      const lease = next!;
      if (n < KEEP_READ) {
        onChunk(Buffer.from(b.subarray(0, n)));
        return;
      }
      next = null;
      onChunk(b.subarray(0, n), lease);
      lease.close(!keeps());
    },
    // The socket is closed: the buffer it would have read into next goes back.
    end: () => {
      next?.close(true);
      next = null;
    },
  };
}

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
   * Starts a process whose streams flow as it runs (see ExecProcess). Errors (the box's agent
   * unreachable, a cwd that cannot be entered) reject `exited`. Aborting `signal` kills the
   * process and its group: exit code 137.
   */
  exec(req: BoxdExecRequest, signal?: AbortSignal): ExecProcess {
    let first: Buffer;
    try {
      first = encodeFrame(Frame.exec, req);
    } catch {
      throw new ExecInputError(`the command, its environment and arguments pass ${MAX_FRAME} bytes`, 'command');
    }
    const sock = net.createConnection(this.socketPath);
    sock.on('error', () => undefined); // replaced below; never an unhandled 'error'
    const decoder = new FrameDecoder();
    let connected = false;
    let finished = false;
    let pid = 0;
    let started = false;
    let lastTyped = 0x0a;
    let resolvePid!: (pid: number) => void;
    const pidKnown = new Promise<number>((r) => (resolvePid = r));
    const stdout = new Readable({ read: () => sock.resume() });
    const stderr = new Readable({ read: () => sock.resume() });
    const send = (f: Buffer, cb?: () => void) => {
      if (sock.destroyed || finished) return cb?.();
      sock.write(f, () => cb?.());
    };
    // stdin: at most STDIN_WINDOW bytes sent and not acknowledged (boxd acks what it has
    // written to the process), so a process that does not read holds the writer here.
    let unacked = 0;
    let windowOpen: (() => void) | null = null;
    const roomFor = async (n: number) => {
      while (unacked + n > STDIN_WINDOW && !finished && !sock.destroyed) await new Promise<void>((r) => (windowOpen = r));
    };
    const acked = (n: number) => {
      unacked = Math.max(0, unacked - n);
      const w = windowOpen;
      windowOpen = null;
      w?.();
    };
    const stdin = !req.stdin
      ? null
      : new Writable({
          write(chunk: Buffer, _enc, cb) {
            if (chunk.length) lastTyped = chunk[chunk.length - 1];
            void (async () => {
              for (let i = 0; i < chunk.length; i += STDIN_FRAME) {
                const part = chunk.subarray(i, i + STDIN_FRAME);
                await roomFor(part.length);
                if (finished || sock.destroyed) break;
                unacked += part.length;
                send(encodeFrame(Frame.stdin, part));
              }
              cb();
            })();
          },
          final(cb) {
            // A terminal's end is typed: ^D (twice after a partial line: the first ends it).
            if (req.tty) send(encodeFrame(Frame.stdin, lastTyped === 0x0a ? '\x04' : '\x04\x04'), () => cb());
            else send(encodeFrame(Frame.stdinEof), () => cb());
          },
        });

    let settle!: { resolve: (v: { exitCode: number; timedOut: boolean }) => void; reject: (e: Error) => void };
    const exited = new Promise<{ exitCode: number; timedOut: boolean }>((resolve, reject) => (settle = { resolve, reject }));
    exited.catch(() => undefined); // the caller may look later: not an unhandled rejection

    let abortTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      if (req.noHup && signal?.reason === EXEC_LET_GO) {
        // Let go: boxd leaves the process running once the connection is gone.
        end();
        settle.resolve({ exitCode: -1, timedOut: false });
        return;
      }
      send(encodeFrame(Frame.signal, { signal: 9, group: true }));
      abortTimer ??= setTimeout(() => fail(new BoxAgentUnavailableError('boxd did not end an aborted process')), ABORT_GRACE_MS);
    };
    const answerTimer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not start the process within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
    // boxd sends the exit after the output: while a slow reader holds the output back (the
    // socket paused), the exit waiting behind it is no sign of a wedged agent.
    const wedged = (): void => {
      if (sock.isPaused() && !finished) wedgedTimer = setTimeout(wedged, TIMEOUT_GRACE_MS);
      else fail(new BoxAgentUnavailableError('boxd did not end a process past its timeout'));
    };
    let wedgedTimer = req.timeoutMs > 0 ? setTimeout(wedged, req.timeoutMs + TIMEOUT_GRACE_MS) : undefined;
    const end = () => {
      finished = true;
      clearTimeout(answerTimer);
      clearTimeout(wedgedTimer);
      clearTimeout(abortTimer);
      signal?.removeEventListener('abort', onAbort);
      acked(Infinity);
      resolvePid(pid);
      stdout.push(null);
      stderr.push(null);
      sock.destroy();
    };
    const fail = (e: Error) => {
      if (finished) return;
      end();
      settle.reject(e);
    };
    const handle = (f: DecodedFrame) => {
      switch (f.type) {
        case Frame.started:
          started = true;
          clearTimeout(answerTimer);
          pid = intField(frameJson(f), 'pid', 0, MAX_PID);
          resolvePid(pid);
          return;
        case Frame.stdout:
        case Frame.stderr:
          // Not paused before `started`: the caller takes no output before it knows the pid,
          // and a boxd before 1.3.1 could send output first (a flood then filled the socket
          // ahead of `started`, and the exec answered 503 at the answer timeout).
          if (!(f.type === Frame.stdout ? stdout : stderr).push(f.payload) && started) sock.pause();
          return;
        case Frame.exit: {
          const o = frameJson(f);
          const code = intField(o, 'code', 0, 255 + 128);
          const timedOut = o.timedOut === true;
          end();
          settle.resolve({ exitCode: code, timedOut });
          return;
        }
        case Frame.stdinAck:
          acked(intField(frameJson(f), 'n', 0, MAX_FRAME));
          return;
        case Frame.error:
          fail(failure(frameJson(f), requestOf(first)));
          return;
        default:
          throw new BoxdProtocolError(`boxd sent '${f.type}' during an exec`);
      }
    };
    // The request goes first: stdin written before the connection is made queues behind it.
    sock.write(first);
    sock.on('connect', () => (connected = true));
    sock.on('data', (chunk: Buffer) => {
      try {
        for (const f of decoder.push(chunk)) {
          if (finished) return;
          handle(f);
        }
      } catch (e) {
        fail(asAgentError(e));
      }
    });
    sock.on('error', (e: NodeJS.ErrnoException) => fail(connectionError(connected, e)));
    sock.on('close', () => fail(new BoxAgentUnavailableError('boxd closed the connection before the process ended')));
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });

    return {
      stdin,
      stdout,
      stderr,
      pid: () => pidKnown,
      async resize(cols, rows) {
        if (!req.tty) return;
        if (![cols, rows].every((n) => Number.isInteger(n) && n > 0 && n <= 0xffff)) throw new RangeError('cols and rows must be integers from 1 to 65535');
        send(encodeFrame(Frame.resize, { cols, rows }));
      },
      signal(sig) {
        const n = os.constants.signals[sig];
        if (n === undefined) throw new RangeError(`unknown signal ${sig}`);
        send(encodeFrame(Frame.signal, { signal: n, group: false }));
      },
      exited,
    };
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

/** A socket error: before the connection was made boxd is unreachable (the box may not run);
 *  after, the agent failed mid-way. */
function connectionError(connected: boolean, e: NodeJS.ErrnoException): Error {
  if (connected) return new BoxAgentUnavailableError(`boxd connection failed: ${e.code ?? e.message}`);
  return new BoxdUnreachableError(`boxd cannot be reached (${e.code ?? e.message})`, e.code ?? 'EUNKNOWN');
}

function asAgentError(e: unknown): Error {
  if (e instanceof BoxdProtocolError) return new BoxAgentUnavailableError(`boxd broke the protocol: ${e.message}`);
  return e instanceof Error ? e : new Error(String(e));
}

/** A failure frame as the error the drivers share. */
/** The request a connection's first frame names. */
function requestOf(first: Buffer): string {
  return String.fromCharCode(first[0]);
}

function failure(o: Record<string, unknown>, request: string): Error {
  const message = textField(o, 'message');
  const service = request === Frame.service;
  const execField = ['command', 'cwd', 'env', 'user', 'timeout'].includes(String(o.field)) ? (o.field as ExecInputError['field']) : null;
  switch (o.kind) {
    case 'cwd':
      return new ExecInputError(message || 'the working directory cannot be entered', 'cwd');
    case 'not_found':
      if (service) return new BoxServiceError('not_found', message || 'no such service', 'name');
      return new BoxFileError(o.kind, message || String(o.kind));
    case 'exists':
    case 'busy':
    case 'permission':
    case 'invalid':
    case 'no_space':
      return new BoxFileError(o.kind, message || String(o.kind));
    case 'conflict':
      if (service) return new BoxServiceError('conflict', message || 'conflict', textField(o, 'field', 64));
      break;
    case 'input':
      if (o.field === 'path' || o.field === 'mode') return new BoxFileError('input', message || 'invalid file request');
      // A service's user, cwd and command fail as an exec's would; its other fields are its own.
      if (service && !execField) return new BoxServiceError('input', message || 'invalid service request', textField(o, 'field', 64));
      return new ExecInputError(message || 'invalid exec request', execField ?? 'command');
  }
  return new BoxAgentUnavailableError(`boxd could not serve the request: ${message || String(o.kind)}`);
}
