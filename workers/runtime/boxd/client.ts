import net from 'node:net';
import os from 'node:os';
import { Readable, Writable } from 'node:stream';
import type { ExecProcess } from '../../drivers';
import { BoxAgentUnavailableError, BoxFileError, ExecInputError } from '../../errors';
import { BOXD_PROTOCOL, BoxdExecRequest, BoxdProtocolError, BoxFileInfo, DecodedFrame, encodeFrame, Frame, FrameDecoder, fileInfo, frameJson, intField, MAX_FRAME, STDIN_FRAME, STDIN_WINDOW, textField } from './protocol';

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

/** The node's side of one box's boxd, reached through the socket the node made at start. */
export class BoxdClient {
  constructor(
    readonly socketPath: string,
    private readonly answerTimeoutMs = BOXD_ANSWER_TIMEOUT_MS,
  ) {}

  /** One request whose answer is a single frame (`body`: frames sent after the request). */
  private request(first: Buffer, want: string, body?: Readable): Promise<DecodedFrame> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(this.socketPath);
      const decoder = new FrameDecoder();
      let connected = false;
      let timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
      const done = (err: Error | null, f?: DecodedFrame) => {
        clearTimeout(timer);
        sock.destroy();
        if (err) reject(err);
        else resolve(f!);
      };
      sock.write(first); // queued until connected
      sock.on('connect', () => (connected = true));
      if (body) {
        // Streamed as frames; the answer timer runs from the end of the body.
        clearTimeout(timer);
        body.on('error', (e) => done(e));
        void (async () => {
          for await (const chunk of body) {
            const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk);
            for (let i = 0; i < b.length; i += MAX_FRAME) {
              if (sock.destroyed) return;
              if (!sock.write(encodeFrame(Frame.stdin, b.subarray(i, i + MAX_FRAME)))) await new Promise((r) => sock.once('drain', r).once('close', r));
            }
          }
          if (sock.destroyed) return;
          sock.write(encodeFrame(Frame.stdinEof));
          timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
        })().catch((e) => done(e));
      }
      sock.on('error', (e: NodeJS.ErrnoException) => done(connectionError(connected, e)));
      sock.on('close', () => done(new BoxAgentUnavailableError('boxd closed the connection without an answer')));
      sock.on('data', (chunk: Buffer) => {
        try {
          const [f] = decoder.push(chunk);
          if (!f) return;
          if (f.type === Frame.error) return done(failure(frameJson(f)));
          if (f.type !== want) throw new BoxdProtocolError(`boxd answered '${f.type}' to a request that wants '${want}'`);
          done(null, f);
        } catch (e) {
          done(asAgentError(e));
        }
      });
    });
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
  read(path: string): Promise<{ info: BoxFileInfo; data: Readable }> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(this.socketPath);
      const decoder = new FrameDecoder();
      let connected = false;
      let info: BoxFileInfo | null = null;
      let ended = false;
      const data = new Readable({ read: () => sock.resume() });
      const timer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
      const fail = (e: Error) => {
        clearTimeout(timer);
        if (ended) return;
        ended = true;
        sock.destroy();
        if (info) data.destroy(e);
        else reject(e);
      };
      sock.write(encodeFrame(Frame.read, { v: BOXD_PROTOCOL, path }));
      sock.on('connect', () => (connected = true));
      sock.on('error', (e: NodeJS.ErrnoException) => fail(connectionError(connected, e)));
      sock.on('close', () => fail(new BoxAgentUnavailableError('boxd closed the connection before the end of the file')));
      sock.on('data', (chunk: Buffer) => {
        try {
          for (const f of decoder.push(chunk)) {
            if (ended) return;
            if (f.type === Frame.error) return fail(failure(frameJson(f)));
            if (!info) {
              if (f.type !== Frame.answer) throw new BoxdProtocolError(`boxd answered '${f.type}' to a read`);
              clearTimeout(timer);
              info = fileInfo(frameJson(f));
              resolve({ info, data });
            } else if (f.type === Frame.data) {
              if (!data.push(Buffer.from(f.payload))) sock.pause();
            } else if (f.type === Frame.end) {
              ended = true;
              data.push(null);
              sock.destroy();
            } else throw new BoxdProtocolError(`boxd sent '${f.type}' during a read`);
          }
        } catch (e) {
          fail(asAgentError(e));
        }
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
      send(encodeFrame(Frame.signal, { signal: 9, group: true }));
      abortTimer ??= setTimeout(() => fail(new BoxAgentUnavailableError('boxd did not end an aborted process')), ABORT_GRACE_MS);
    };
    const answerTimer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not start the process within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
    const wedgedTimer = req.timeoutMs > 0 ? setTimeout(() => fail(new BoxAgentUnavailableError('boxd did not end a process past its timeout')), req.timeoutMs + TIMEOUT_GRACE_MS) : undefined;
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
          clearTimeout(answerTimer);
          pid = intField(frameJson(f), 'pid', 0, MAX_PID);
          resolvePid(pid);
          return;
        case Frame.stdout:
        case Frame.stderr:
          if (!(f.type === Frame.stdout ? stdout : stderr).push(Buffer.from(f.payload))) sock.pause();
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
          fail(failure(frameJson(f)));
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
function failure(o: Record<string, unknown>): Error {
  const message = textField(o, 'message');
  switch (o.kind) {
    case 'cwd':
      return new ExecInputError(message || 'the working directory cannot be entered', 'cwd');
    case 'not_found':
    case 'exists':
    case 'permission':
    case 'invalid':
    case 'no_space':
      return new BoxFileError(o.kind, message || String(o.kind));
    case 'input': {
      if (o.field === 'path' || o.field === 'mode') return new BoxFileError('input', message || 'invalid file request');
      const field = ['command', 'cwd', 'env', 'user', 'timeout'].includes(String(o.field)) ? (o.field as 'command') : 'command';
      return new ExecInputError(message || 'invalid exec request', field);
    }
    default:
      return new BoxAgentUnavailableError(`boxd could not serve the request: ${message || String(o.kind)}`);
  }
}
