import { PassThrough, Writable } from 'node:stream';
import type WebSocket from 'ws';
import { Channel, parseWsFrame, rawSocket, signalName, wsFrame, wsJson } from '../core/wsChannel';
import type { ExecSession, SessionExit } from './types';

/** Output not yet taken by a slow peer, past which the process's output is paused. */
const HIGH_WATER = 1 << 20;
/**
 * What may wait in memory beyond that, either way, before the session is ended (1008): ws 7
 * resumes a paused socket by itself after large chunks, so pausing bounds the flow only
 * roughly, and this is the hard bound.
 */
const HARD_LIMIT = 16 << 20;
/** A peer that answers no ping for this long is gone (a laptop closed, a NAT that forgot),
 *  unless output waits on it (`keepAlive`). */
const PING_MS = 30_000;

/** Test-only seam: a shorter ping interval for sessions opened while it is set. */
const pingMs = () => Number(process.env.BOXHOST_TEST_WS_PING_MS) || PING_MS;

/**
 * Relays a session over a WebSocket in the `boxhost.v1.channel` framing (core/wsChannel.ts):
 * what the api does for its client, and a node agent for the api. Back-pressure both ways: the
 * process's output pauses while more than HIGH_WATER bytes wait for the peer, and the socket
 * stops being read while the process does not take its stdin. The peer closing ends the
 * process (a no_hup session lets go of it instead); the process ending sends its status and closes.
 */
/** The close code by which the api asks a node agent to end a relayed session's process (any
 *  other close is a hang-up, which a no_hup session outlives). */
export const KILL_CLOSE_CODE = 4001;

export function bridgeSession(ws: WebSocket, session: ExecSession): void {
  let pending = 0;
  let lastSent = 0;
  let closed = false;
  const outputs = [session.stdout, session.stderr];
  const sent = (n: number) => () => {
    pending -= n;
    if (pending <= HIGH_WATER) for (const s of outputs) s.resume();
  };
  const relay = (stream: NodeJS.ReadableStream, channel: number) => {
    stream.on('data', (d: Buffer) => {
      if (closed) return;
      pending += d.length;
      lastSent = Date.now();
      ws.send(wsFrame(channel, d), sent(d.length));
      if (pending > HIGH_WATER) for (const s of outputs) s.pause();
    });
  };
  relay(session.stdout, Channel.stdout);
  relay(session.stderr, Channel.stderr);
  const ended = Promise.all(outputs.map((s) => new Promise<void>((r) => (s.readableEnded ? r() : s.once('end', r).once('close', r)))));

  let waitingDrain = false;
  ws.on('message', (data: Buffer) => {
    const f = parseWsFrame(data);
    if (!f) return;
    switch (f.channel) {
      case Channel.stdin:
        if (!session.stdin.writableEnded && !session.stdin.write(f.payload) && !waitingDrain) {
          waitingDrain = true;
          rawSocket(ws)?.pause();
          session.stdin.once('drain', () => {
            waitingDrain = false;
            rawSocket(ws)?.resume();
          });
        }
        return;
      case Channel.close:
        if (f.payload[0] === Channel.stdin) session.stdin.end();
        return;
      case Channel.resize: {
        const o = wsJson(f.payload);
        const cols = Number(o?.cols);
        const rows = Number(o?.rows);
        if ([cols, rows].every((n) => Number.isInteger(n) && n > 0 && n <= 0xffff)) session.resize(cols, rows);
        return;
      }
      case Channel.signal: {
        const sig = signalName(wsJson(f.payload)?.signal);
        if (sig) session.signal(sig);
        return;
      }
    }
  });
  session.stdin.on('error', () => undefined);
  // The stdin the process does not take is bounded.
  const overflow = setInterval(() => {
    if (session.stdin.writableLength > HARD_LIMIT) ws.close(1008, 'stdin not taken');
  }, 250);
  // Output waits on the peer while some is not yet in the kernel's buffers, and while the
  // kernel's buffers may hold some it has not read: a process slower than the buffers fill
  // leaves nothing pending between its writes, to a peer that has read nothing for minutes.
  // No cap on the unanswered pings here: a client paused for minutes answers its pings only
  // after it has read what they queued behind, when nothing is pending any more; a peer that is
  // gone with output sent to it leaves that output unacknowledged, and TCP gives up on it
  // (tcp_retries2: about 15 minutes).
  const ping = keepAlive(ws, () => pending > 0 || Date.now() - lastSent < 2 * pingMs());
  // The peer hanging up lets go of a no_hup process; the api's relay of a session that must end
  // (its client never completed the upgrade) says so with KILL_CLOSE_CODE.
  ws.on('close', (code: number) => {
    closed = true;
    clearInterval(overflow);
    clearInterval(ping);
    if (code === KILL_CLOSE_CODE) session.close();
    else session.release();
  });
  ws.on('error', () => undefined);
  // The socket may be paused for a stdin the process never drained (it exited first): read again,
  // or the peer's answer to the close is never seen and ws waits out its 30 s close timeout.
  const closeWith = (code: number, reason?: string) => {
    waitingDrain = false;
    rawSocket(ws)?.resume();
    ws.close(code, reason);
  };
  session.exited.then(
    async ({ exitCode, timedOut }) => {
      await ended;
      if (closed) return;
      ws.send(wsFrame(Channel.status, { exit_code: exitCode, ...(timedOut ? { timed_out: true } : {}) }), () => closeWith(1000));
    },
    (e: Error) => {
      if (closed) return;
      ws.send(wsFrame(Channel.status, { exit_code: -1, error: e.message }), () => closeWith(1011, 'session failed'));
    },
  );
}

/**
 * The other side: a session relayed by `bridgeSession` over `ws`, as an ExecSession (the api's
 * view of a session on a node reached through its agent).
 */
export function sessionOverWs(ws: WebSocket): ExecSession {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let settle!: { resolve: (v: SessionExit) => void; reject: (e: Error) => void };
  const exited = new Promise<SessionExit>((resolve, reject) => (settle = { resolve, reject }));
  exited.catch(() => undefined);
  let done = false;
  const finish = (err: Error | null, code = -1, timedOut = false) => {
    if (done) return;
    done = true;
    stdout.end();
    stderr.end();
    if (err) settle.reject(err);
    else settle.resolve({ exitCode: code, ...(timedOut ? { timedOut: true } : {}) });
  };
  const resumeSocket = () => rawSocket(ws)?.resume();
  stdout.on('drain', resumeSocket);
  stderr.on('drain', resumeSocket);
  ws.on('message', (data: Buffer) => {
    const f = parseWsFrame(data);
    if (!f) return;
    if (f.channel === Channel.stdout || f.channel === Channel.stderr) {
      const out = f.channel === Channel.stdout ? stdout : stderr;
      if (out.writableLength > HARD_LIMIT) return void ws.close(1008, 'output not taken');
      if (!out.write(f.payload)) rawSocket(ws)?.pause();
    } else if (f.channel === Channel.status) {
      const o = wsJson(f.payload);
      const code = Number(o?.exit_code);
      if (typeof o?.error === 'string') finish(new Error(String(o.error).slice(0, 500)));
      else finish(null, Number.isInteger(code) && code >= -1 && code <= 255 ? code : -1, o?.timed_out === true);
    }
  });
  // While output waits here for a slow consumer the socket is not read, pongs included: the
  // node is not gone for that (before, a consumer slow for a minute lost its relayed session).
  const ping = keepAlive(ws, () => [stdout, stderr].some((o) => o.readableLength + o.writableLength > 0));
  ws.on('close', () => {
    clearInterval(ping);
    finish(new Error('the node closed the session without its status'));
  });
  ws.on('error', () => undefined);
  const send = (b: Buffer, cb?: (e?: Error) => void) => {
    if (ws.readyState === ws.OPEN) ws.send(b, cb);
    else cb?.();
  };
  const stdin = new Writable({
    write(chunk: Buffer, _enc, cb) {
      // Acknowledged by the socket's own write: a slow node slows the writer.
      send(wsFrame(Channel.stdin, chunk), () => cb());
    },
    final(cb) {
      send(Buffer.from([Channel.close, Channel.stdin]), () => cb());
    },
  });
  return {
    stdin,
    stdout,
    stderr,
    resize: (cols, rows) => send(wsFrame(Channel.resize, { cols, rows })),
    signal: (sig) => send(wsFrame(Channel.signal, { signal: sig })),
    close: () => {
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close(KILL_CLOSE_CODE, 'end the process');
    },
    release: () => {
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close(1000);
    },
    exited,
  };
}

/**
 * Pings the peer every PING_MS; one that has not answered the last ping is cut off, unless
 * output is waiting for it (`waiting`): a peer that does not read, for back-pressure (a CLI
 * whose stdout is a paused pager), cannot answer either, and is slow rather than gone (a
 * peer that is gone fails the socket's writes in the end, once TCP gives up).
 */
function keepAlive(ws: WebSocket, waiting: () => boolean = () => false): NodeJS.Timeout {
  let alive = true;
  // Whatever comes in says the peer is there: a pong that waited behind megabytes of output in
  // the socket is read only after them.
  ws.on('pong', () => (alive = true));
  ws.on('message', () => (alive = true));
  const timer = setInterval(() => {
    if (!alive && !waiting() && ws.bufferedAmount === 0) return ws.terminate();
    alive = false;
    if (ws.readyState === ws.OPEN) ws.ping();
  }, pingMs());
  timer.unref();
  return timer;
}
