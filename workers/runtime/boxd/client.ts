import net from 'node:net';
import os from 'node:os';
import { Readable, Writable } from 'node:stream';
import type { ExecProcess } from '../../drivers';
import { BoxAgentUnavailableError, ExecInputError } from '../../errors';
import { BOXD_PROTOCOL, BoxdExecRequest, BoxdProtocolError, DecodedFrame, encodeFrame, Frame, FrameDecoder, frameJson, intField, MAX_FRAME, textField } from './protocol';

/** How long boxd has to answer a request (a started, hello or ok frame). */
export const BOXD_ANSWER_TIMEOUT_MS = 10_000;
/** Past an exec's own timeout, how long boxd has to report the kill before it counts as wedged. */
const TIMEOUT_GRACE_MS = 10_000;
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

  /** One request whose answer is a single frame. */
  private request(first: Buffer, want: string): Promise<DecodedFrame> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(this.socketPath);
      const decoder = new FrameDecoder();
      let connected = false;
      const timer = setTimeout(() => done(new BoxAgentUnavailableError(`boxd did not answer within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
      const done = (err: Error | null, f?: DecodedFrame) => {
        clearTimeout(timer);
        sock.destroy();
        if (err) reject(err);
        else resolve(f!);
      };
      sock.write(first); // queued until connected
      sock.on('connect', () => (connected = true));
      sock.on('error', (e: NodeJS.ErrnoException) => done(connected ? new BoxAgentUnavailableError(`boxd connection failed: ${e.code ?? e.message}`) : unreachable(e)));
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
    const sock = net.createConnection(this.socketPath);
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
    const stdin = !req.stdin
      ? null
      : new Writable({
          write(chunk: Buffer, _enc, cb) {
            if (chunk.length) lastTyped = chunk[chunk.length - 1];
            for (let i = 0; i < chunk.length; i += MAX_FRAME) {
              const part = chunk.subarray(i, i + MAX_FRAME);
              send(encodeFrame(Frame.stdin, part), i + MAX_FRAME >= chunk.length ? () => cb() : undefined);
            }
            if (chunk.length === 0) cb();
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

    let aborted = false;
    const onAbort = () => {
      aborted = true;
      send(encodeFrame(Frame.signal, { signal: 9, group: true }));
    };
    const answerTimer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not start the process within ${this.answerTimeoutMs} ms`)), this.answerTimeoutMs);
    const wedgedTimer = req.timeoutMs > 0 ? setTimeout(() => fail(new BoxAgentUnavailableError('boxd did not end a process past its timeout')), req.timeoutMs + TIMEOUT_GRACE_MS) : undefined;
    const end = () => {
      finished = true;
      clearTimeout(answerTimer);
      clearTimeout(wedgedTimer);
      signal?.removeEventListener('abort', onAbort);
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
          settle.resolve({ exitCode: aborted && !timedOut ? 137 : code, timedOut });
          return;
        }
        case Frame.error:
          fail(failure(frameJson(f)));
          return;
        default:
          throw new BoxdProtocolError(`boxd sent '${f.type}' during an exec`);
      }
    };
    // The request goes first: stdin written before the connection is made queues behind it.
    sock.write(encodeFrame(Frame.exec, req));
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
    sock.on('error', (e: NodeJS.ErrnoException) => fail(connected ? new BoxAgentUnavailableError(`boxd connection failed: ${e.code ?? e.message}`) : unreachable(e)));
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

function unreachable(e: NodeJS.ErrnoException): BoxdUnreachableError {
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
    case 'input': {
      const field = ['command', 'cwd', 'env', 'user', 'timeout'].includes(String(o.field)) ? (o.field as 'command') : 'command';
      return new ExecInputError(message || 'invalid exec request', field);
    }
    default:
      return new BoxAgentUnavailableError(`boxd could not serve the request: ${message || String(o.kind)}`);
  }
}
