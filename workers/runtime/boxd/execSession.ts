import net from 'node:net';
import os from 'node:os';
import { Readable, Writable } from 'node:stream';
import { EXEC_LET_GO, type ExecProcess } from '../../drivers';
import { BoxAgentUnavailableError, ExecInputError } from '../../errors';
import { BoxdExecRequest, BoxdProtocolError, DecodedFrame, encodeFrame, Frame, FrameDecoder, frameJson, intField, MAX_FRAME, STDIN_FRAME, STDIN_WINDOW } from './protocol';
import { asAgentError, connectionError, failure, MAX_PID, requestOf } from './answers';

/** Past an exec's own timeout, how long boxd has to report the kill before it counts as wedged. */
const TIMEOUT_GRACE_MS = 10_000;
/** After an abort, how long boxd has to report the kill before the exec is given up on. */
const ABORT_GRACE_MS = 5_000;

/**
 * Starts a process whose streams flow as it runs (see ExecProcess). Errors (the box's agent
 * unreachable, a cwd that cannot be entered) reject `exited`. Aborting `signal` kills the
 * process and its group: exit code 137.
 */
export function openExec(socketPath: string, answerTimeoutMs: number, req: BoxdExecRequest, signal?: AbortSignal): ExecProcess {
  let first: Buffer;
  try {
    first = encodeFrame(Frame.exec, req);
  } catch {
    throw new ExecInputError(`the command, its environment and arguments pass ${MAX_FRAME} bytes`, 'command');
  }
  const sock = net.createConnection(socketPath);
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
  const answerTimer = setTimeout(() => fail(new BoxAgentUnavailableError(`boxd did not start the process within ${answerTimeoutMs} ms`)), answerTimeoutMs);
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
