import WebSocket from 'ws';
import { Channel, parseWsFrame, rawSocket, WS_SUBPROTOCOL, wsFrame, wsJson } from '../core/wsChannel';
import { ApiError, ConnectionError, parseJson, type Client } from './client';

/** Where a session's output goes: a handler answering false is full (a stream's `write`), and
 *  the session reads nothing more until `drain` is called (back-pressure up to the box). */
export interface OutputHandlers {
  stdout(b: Buffer): boolean | void;
  stderr(b: Buffer): boolean | void;
}

/**
 * A WebSocket session of the api (exec/ws, console) from the CLI: the token in the header
 * (the CLI can set headers; tickets are for browsers), refusals read as the api's errors.
 */
export interface CliSession {
  ws: WebSocket;
  /** Calls for each stdout/stderr chunk, then resolves with the exit code. */
  run(handlers: OutputHandlers): Promise<number>;
  /** Reading again after a handler answered false. */
  drain(): void;
  /** Whether the session's timeout (`timeout_secs`) ended the process; known once run() ended. */
  timedOut(): boolean;
  stdin(b: Buffer): void;
  endStdin(): void;
  resize(cols: number, rows: number): void;
  signal(sig: string): void;
}

/** A session's handshake, sent again while the api refuses it for now (cli/client.ts `withRetry`):
 *  as a POST, since the api starts the process before it upgrades (only a 429 is sent again). */
export function openSession(client: Client, path: string, query: URLSearchParams): Promise<CliSession> {
  return client.withRetry('POST', () => openSessionOnce(client, path, query));
}

function openSessionOnce(client: Client, path: string, query: URLSearchParams): Promise<CliSession> {
  const url = new URL(client.endpoint.url + path);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.search = query.toString();
  const headers: Record<string, string> = client.endpoint.token ? { authorization: `Bearer ${client.endpoint.token}` } : {};
  const ws = new WebSocket(url, WS_SUBPROTOCOL, { headers });
  return new Promise((resolve, reject) => {
    ws.on('unexpected-response', (_req, res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => reject(client.toError(res.statusCode ?? 0, res.statusMessage ?? '', parseJson(text), text, res.headers['retry-after'])));
    });
    ws.on('error', (e) => reject(new ConnectionError(client.endpoint, e)));
    ws.on('open', () => {
      const send = (b: Buffer) => ws.readyState === ws.OPEN && ws.send(b);
      // Listened to from the first moment: the box's first output (a shell's prompt) may come in
      // the same packet as the handshake, before the caller has called run(). Kept until then.
      const early: Buffer[] = [];
      let onFrame: ((data: Buffer) => void) | null = null;
      let timedOut = false;
      ws.on('message', (data: Buffer) => (onFrame ? onFrame(data) : early.push(data)));
      resolve({
        ws,
        run: (h) =>
          new Promise((done, fail) => {
            let code: number | null = null;
            onFrame = (data: Buffer) => {
              const f = parseWsFrame(data);
              if (!f) return;
              if (f.channel === Channel.stdout || f.channel === Channel.stderr) {
                if ((f.channel === Channel.stdout ? h.stdout : h.stderr)(f.payload) === false) rawSocket(ws)?.pause();
              } else if (f.channel === Channel.status) {
                const o = wsJson(f.payload);
                if (typeof o?.error === 'string') return fail(new ApiError(503, 'unavailable', o.error));
                code = Number(o?.exit_code ?? 1);
                timedOut = o?.timed_out === true;
              }
            };
            for (const b of early.splice(0)) onFrame(b);
            const closed = () => (code === null ? fail(new ApiError(503, 'unavailable', 'the session ended without its exit code')) : done(code));
            if (ws.readyState === ws.CLOSED) closed();
            else ws.on('close', closed);
          }),
        drain: () => rawSocket(ws)?.resume(),
        timedOut: () => timedOut,
        stdin: (b) => send(wsFrame(Channel.stdin, b)),
        endStdin: () => send(Buffer.from([Channel.close, Channel.stdin])),
        resize: (cols, rows) => send(wsFrame(Channel.resize, { cols, rows })),
        signal: (sig) => send(wsFrame(Channel.signal, { signal: sig })),
      });
    });
  });
}

/** How much output may wait in this process for its stdout or stderr before the session is
 *  no longer read (back-pressure up to the box). Rather more than a stream's own 16 KiB: a
 *  paused socket cannot answer the api's pings either, and the api keeps only a socket that
 *  output waits on. */
const OUTPUT_BUFFER = 4 << 20;

/** This process's stdout and stderr as a session's output, with their back-pressure. */
function toTerminal(session: CliSession): OutputHandlers & { done(): void } {
  const drain = () => session.drain();
  process.stdout.on('drain', drain);
  process.stderr.on('drain', drain);
  const write = (out: NodeJS.WriteStream, b: Buffer) => out.write(b) || out.writableLength < OUTPUT_BUFFER;
  return {
    stdout: (b) => write(process.stdout, b),
    stderr: (b) => write(process.stderr, b),
    done: () => {
      process.stdout.off('drain', drain);
      process.stderr.off('drain', drain);
    },
  };
}

/**
 * Runs a session with its output on this process's (a plain `box exec`): no input, as `docker
 * exec` without -i (a pipe's stdin ended at once; a terminal's left open, as an end there
 * would be a typed ^D); answers the remote exit code.
 */
export async function runDetachedFromStdin(session: CliSession, tty: boolean): Promise<number> {
  if (!tty) session.endStdin();
  const out = toTerminal(session);
  try {
    return await session.run(out);
  } finally {
    out.done();
  }
}

/**
 * Runs a session attached to this terminal: raw mode when `tty` (every key goes to the box,
 * ^C included), the size sent at the start and on every SIGWINCH, stdin relayed (its end sent
 * as EOF), and answers the remote exit code.
 */
export async function attach(session: CliSession, tty: boolean): Promise<number> {
  const stdin = process.stdin;
  const rawWas = stdin.isTTY ? stdin.isRaw : false;
  const resize = () => {
    if (process.stdout.isTTY && process.stdout.columns > 0 && process.stdout.rows > 0) session.resize(process.stdout.columns, process.stdout.rows);
  };
  if (tty && stdin.isTTY) stdin.setRawMode(true);
  if (tty) {
    resize();
    process.on('SIGWINCH', resize);
  }
  const onData = (b: Buffer) => session.stdin(b);
  const onEnd = () => session.endStdin();
  stdin.on('data', onData);
  stdin.on('end', onEnd);
  stdin.resume();
  const out = toTerminal(session);
  try {
    return await session.run(out);
  } finally {
    out.done();
    stdin.off('data', onData);
    stdin.off('end', onEnd);
    stdin.pause();
    process.off('SIGWINCH', resize);
    if (tty && stdin.isTTY) stdin.setRawMode(rawWas);
  }
}
