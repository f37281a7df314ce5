import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import type net from 'node:net';
import os from 'node:os';
import { Readable, Transform, Writable } from 'node:stream';
import { run, sleep } from '../../core/command';
import type { ExecProcess } from '../drivers';
import { BoxNotRunningError, ExecInputError } from '../errors';

/** What the exec wrapper answers when it cannot enter the working directory. */
export const CWD_FAILED_CODE = 211;
export const CWD_FAILED_MARK = 'boxhost-exec: cannot enter working directory';

/** The first bytes of an output kept: enough to recognise the cwd failure line. */
const HEAD_BYTES = 256;

/** A `runc exec` just spawned (under `script` for a tty), its stdio as Node streams. */
export interface SpawnedExec {
  child: ChildProcess;
  out: net.Socket;
  err: net.Socket;
  /** The process's stdin (for a tty: the terminal's), or null. */
  input: net.Socket | null;
  tty: boolean;
  /** Whether the caller gets a stdin stream. */
  stdin: boolean;
  timeoutMs?: number;
  cwd: string;
  pidFile: string;
  logFile: string;
  /** runc's `--process` file: removed as soon as runc has started the process. */
  processFile: string;
  /** Aborting it kills the process and its group; it then ends with exit code 137. */
  signal?: AbortSignal;
}

/** The exit code of a process killed because its caller went away (128 + SIGKILL). */
const ABORTED_EXIT_CODE = 137;

/**
 * Watches a spawned runc exec and hands its streams out: the tty gate, the timeout and abort
 * kills, the drain, runc's own failure. Called synchronously after the spawn, or a process that
 * ends at once (a bad cwd) exits unheard. Removes the pid, log and process files once the
 * process is done (the process file as soon as it runs).
 * Output flows through with back-pressure: `exited` waits until all of it has been passed
 * into `stdout` and `stderr`, so a caller that stops reading a stream that still has more
 * than its buffers hold also holds `exited`.
 */
export function superviseExec(s: SpawnedExec): ExecProcess {
  const { child, out, err, input, tty, pidFile, logFile, processFile } = s;
  const childExit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve({ code: child.exitCode, signal: child.signalCode });
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve({ code, signal }));
  });
  let done = false; // runc has exited
  void childExit.then(() => (done = true), () => (done = true));
  input?.on('error', () => {
    /* the process did not read its stdin: fine */
  });

  const heads = { out: { text: '' }, err: { text: '' } };
  const stdout = relay(out, heads.out);
  const stderr = relay(err, heads.err);

  let knownPid = 0;
  let settled = false; // the pid file has been read for the last time
  const pidOf = async (): Promise<number> => {
    while (!knownPid && !settled) {
      knownPid = await readPid(pidFile);
      if (!knownPid) await sleep(2);
    }
    return knownPid;
  };
  // runc writes the pid file once the process runs, long after it has read the process file.
  void pidOf().then(() => fs.promises.rm(processFile, { force: true }));

  // A tty process waits stopped in TTY_GATE until runc has set its terminals up; input is
  // typed only once it runs.
  const resumed = tty ? resumeWhenReady(pidOf, () => done) : Promise.resolve(true);
  const stdin = !s.stdin ? null : tty ? typedInput(input!, resumed) : input;

  let timedOut = false;
  let aborted = false;
  let timer: NodeJS.Timeout | undefined;
  let killer: NodeJS.Timeout | undefined;
  const killAll = () => {
    if (killer) return;
    const kill = async () => {
      const pid = await readPid(pidFile);
      if (pid > 0) {
        // The box process first, so that runc (its parent) reaps it and exits.
        tryKill(-pid); // its group, when it leads one (a tty process leads its session)
        tryKill(pid);
      } else if (child.pid) {
        tryKill(-child.pid); // not started yet: runc and all
      }
    };
    void kill();
    killer = setInterval(() => void kill(), 100);
  };
  if (s.timeoutMs !== undefined) {
    timer = setTimeout(() => {
      timedOut = !aborted;
      killAll();
    }, s.timeoutMs);
  }
  const onAbort = () => {
    aborted = !timedOut;
    killAll();
  };
  if (s.signal?.aborted) onAbort();
  else s.signal?.addEventListener('abort', onAbort, { once: true });

  const exited = (async () => {
    try {
      let result: { code: number | null; signal: NodeJS.Signals | null };
      try {
        result = await childExit;
      } finally {
        clearTimeout(timer);
        clearInterval(killer);
        s.signal?.removeEventListener('abort', onAbort);
      }
      // Children the killed process left in runc's process group go too.
      if ((timedOut || aborted) && !tty && child.pid) tryKill(-child.pid);
      await drain([
        { raw: out, relay: stdout },
        { raw: err, relay: stderr },
      ]);
      input?.destroy(); // kept open until now: script would turn its end into a stray byte
      if (timedOut) return { exitCode: 124, timedOut };
      if (aborted) return { exitCode: ABORTED_EXIT_CODE, timedOut };
      await throwIfRuncFailed(logFile);
      const exitCode = result.code ?? (result.signal ? 128 + (os.constants.signals[result.signal] ?? 0) : -1);
      const cwdFailed = (h: { text: string }) => h.text.length < HEAD_BYTES && h.text.trim() === CWD_FAILED_MARK;
      if (exitCode === CWD_FAILED_CODE && (cwdFailed(heads.err) || (tty && cwdFailed(heads.out)))) {
        throw new ExecInputError(`working directory ${s.cwd} does not exist in the box or cannot be entered`, 'cwd');
      }
      return { exitCode, timedOut };
    } finally {
      knownPid ||= await readPid(pidFile);
      settled = true;
      await Promise.all([pidFile, logFile, processFile].map((f) => fs.promises.rm(f, { force: true })));
    }
  })();
  exited.catch(() => undefined); // the caller may look later: not an unhandled rejection

  let terminal: Promise<string | null> | undefined;
  return {
    stdin,
    stdout,
    stderr,
    pid: pidOf,
    async resize(cols, rows) {
      if (!tty) return;
      if (![cols, rows].every((n) => Number.isInteger(n) && n > 0 && n <= 0xffff)) throw new RangeError('cols and rows must be integers from 1 to 65535');
      const pid = await pidOf();
      if (!pid || done) return;
      // runc sizes the box's pty like its own terminal whenever that one changes size (the
      // kernel tells it with SIGWINCH): so size runc's terminal.
      const pts = await (terminal ??= runcTerminal(pid));
      if (pts) await run(['stty', '-F', pts, 'cols', String(cols), 'rows', String(rows)], { allowFailure: true });
    },
    signal(sig) {
      if (os.constants.signals[sig] === undefined) throw new RangeError(`unknown signal ${sig}`);
      void pidOf().then((pid) => pid && !done && tryKill(pid, sig));
    },
    exited,
  };
}

/** Passes a stream on (its back-pressure too), keeping its first bytes in `head`. */
function relay(raw: Readable, head: { text: string }): Transform {
  const t = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      if (head.text.length < HEAD_BYTES) head.text += chunk.toString('latin1');
      cb(null, chunk);
    },
  });
  raw.pipe(t);
  return t;
}

/** Resumes a tty process stopped in TTY_GATE once runc has set its terminals up; false when
 *  it is gone first. */
async function resumeWhenReady(pidOf: () => Promise<number>, done: () => boolean): Promise<boolean> {
  const pid = await pidOf();
  for (let i = 0; pid && !done() && i < 5000; i++) {
    const state = await processState(pid);
    if (state === null) return false; // gone already
    if (state === 'T') break;
    await sleep(1);
  }
  if (!pid || done()) return false;
  return tryKill(pid, 'SIGCONT');
}

/** A tty's input: bytes typed at the terminal once the process runs; its end types ^D (twice
 *  after a partial line: the first ends the line). The terminal itself stays open. */
function typedInput(term: Writable, resumed: Promise<boolean>): Writable {
  let last = 0x0a;
  const type = (data: Buffer | string, cb: () => void) =>
    void resumed.then((ok) => (ok && !term.destroyed ? term.write(data, () => cb()) : cb()));
  return new Writable({
    write(chunk: Buffer, _enc, cb) {
      if (chunk.length) last = chunk[chunk.length - 1];
      type(chunk, cb);
    },
    final(cb) {
      type(last === 0x0a ? '\x04' : '\x04\x04', cb);
    },
  });
}

/** The terminal runc relays the box's pty to: the stdin of runc, the box process's parent. */
async function runcTerminal(pid: number): Promise<string | null> {
  try {
    const ppid = /^PPid:\s+(\d+)$/m.exec(await fs.promises.readFile(`/proc/${pid}/status`, 'utf8'))?.[1];
    const tty = ppid ? await fs.promises.readlink(`/proc/${ppid}/fd/0`) : '';
    return /^\/dev\/pts\/\d+$/.test(tty) ? tty : null;
  } catch {
    return null; // gone
  }
}

/**
 * Waits for stdout and stderr to reach their end. Once the process is gone, a background child
 * of it that still holds them open is not waited for past a quiet moment (nothing new read and
 * nothing left unread), nor past 3 s while the reader keeps up.
 */
function drain(streams: { raw: net.Socket; relay: Transform }[]): Promise<void> {
  return new Promise((resolve) => {
    const open = () => streams.filter((s) => !s.raw.destroyed);
    const bytesRead = () => streams.reduce((n, s) => n + s.raw.bytesRead, 0);
    const unread = () => open().some((s) => s.raw.readableLength > 0 || s.relay.writableLength > 0 || s.relay.readableLength > 0);
    const start = Date.now();
    let last = start;
    let seen = bytesRead();
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearInterval(iv);
      for (const s of streams) {
        if (!s.raw.destroyed) {
          s.raw.unpipe(s.relay);
          s.raw.destroy();
        }
        if (!s.relay.writableEnded) s.relay.end();
      }
      resolve();
    };
    const iv = setInterval(() => {
      const now = Date.now();
      const waiting = unread();
      if (bytesRead() !== seen || waiting) [seen, last] = [bytesRead(), now];
      if (now - last > 200 || (now - start > 3000 && !waiting)) finish();
    }, 50);
    for (const s of open()) s.raw.once('close', () => open().length === 0 && finish());
    if (open().length === 0) finish();
  });
}

/** runc's own failure (as opposed to the process's exit code) is in its log file. */
async function throwIfRuncFailed(logFile: string): Promise<void> {
  let log = '';
  try {
    log = await fs.promises.readFile(logFile, 'utf8');
  } catch {
    /* no log: runc said nothing */
  }
  const errors: string[] = [];
  for (const line of log.split('\n')) {
    if (!line.trim()) continue;
    try {
      const entry = JSON.parse(line) as { level?: string; msg?: string };
      if (entry.level === 'error' || entry.level === 'fatal') errors.push(entry.msg ?? '');
    } catch {
      /* not JSON */
    }
  }
  if (errors.length === 0) return;
  const msg = errors.join('; ');
  if (/does not exist|stopped container|paused container|not running|cannot exec in a/i.test(msg)) {
    throw new BoxNotRunningError(`box is not running: ${msg}`);
  }
  throw new Error(`runc exec failed: ${msg}`);
}

async function readPid(file: string): Promise<number> {
  try {
    const n = Number((await fs.promises.readFile(file, 'utf8')).trim());
    return Number.isInteger(n) && n > 0 ? n : 0;
  } catch {
    return 0;
  }
}

/** The state letter of a host process (R, S, T, Z, …), null when it is gone. */
async function processState(pid: number): Promise<string | null> {
  try {
    const stat = await fs.promises.readFile(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).charAt(0) || null;
  } catch {
    return null;
  }
}

function tryKill(pid: number, sig: NodeJS.Signals = 'SIGKILL'): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false; // gone already
  }
}
