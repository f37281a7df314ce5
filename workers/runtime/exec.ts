import { ChildProcess, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { run } from '../../core/command';
import type { ExecOptions, ExecProcess, ExecResult, ExecStreamOptions, IdMap } from '../drivers';
import { BoxNeedsRestartError, ExecInputError } from '../errors';
import { resolveUser, ResolvedUser } from './accounts';
import { CWD_FAILED_CODE, CWD_FAILED_MARK, superviseExec } from './execProcess';
import { BOX_BUSYBOX, boxRlimits, DEFAULT_CAPABILITIES, processEnv, validateEnvironment } from './ociSpec';
import { EXEC_OUTPUT_CAP_BYTES } from '../../cluster/types';
import type { BoxdClient } from './boxd/client';
import { BOXD_PROTOCOL, BoxdExecRequest } from './boxd/protocol';

/** Each of stdout and stderr of a collected exec is kept up to this many bytes; past that the
 *  process is killed and the answer says `truncated`. */
export { EXEC_OUTPUT_CAP_BYTES };
export const SCRIPT_BIN = '/usr/bin/script';

/**
 * Runs inside the box as `/.boxhost/busybox sh -c WRAPPER boxhost-exec CWD CMD ARGS…`.
 * runc itself always starts the process with cwd `/`; the `cd` happens here, after the exec,
 * so the path resolves inside the box's own mount namespace and root: no file descriptor
 * runc holds (CVE-2024-21626) can be reached through it. The command is then looked up in
 * the box's PATH by hand, because busybox's shell would otherwise prefer its own applets
 * over the box's binaries of the same name.
 */
const WRAPPER_RESTORE_MARK = ':boxhost-restore-env:';
const WRAPPER_PREAMBLE = [
  `if ! cd -- "$1" 2>/dev/null; then echo "${CWD_FAILED_MARK}" >&2; exit ${CWD_FAILED_CODE}; fi`,
  'shift',
  'c="$1"',
  'case "$c" in',
  '  */*) p="$c" ;;',
  '  *)',
  '    p=',
  '    IFS=:',
  '    for d in $PATH; do',
  '      [ -n "$d" ] || d=.',
  '      if [ -f "$d/$c" ] && [ -x "$d/$c" ]; then p="$d/$c"; break; fi',
  '    done',
  '    unset IFS',
  '    if [ -z "$p" ]; then echo "boxhost-exec: $c: command not found" >&2; exit 127; fi',
  '    ;;',
  'esac',
  'shift',
  WRAPPER_RESTORE_MARK,
];
export const EXEC_WRAPPER = [...WRAPPER_PREAMBLE, 'exec -a "$c" "$p" "$@"'].join('\n');
/**
 * runc (1.1) copies a foreground process's stdio through pipes of its own and only exits when
 * every holder of them has closed them, so a background child (`sleep 60 &`) would hold the
 * answer. So the caller's pipes are passed in as fds 3 and 4 (and 5 for stdin) with
 * `--preserve-fds`, and the wrapper puts them in place before anything else: runc's own pipes
 * then close at once and runc answers when the process exits.
 */
const REDIRECT_OUTPUT = 'exec 1>&3 2>&4 3>&- 4>&-';
/**
 * With a tty, runc sets the terminals up (the box's pty loses ONLCR, its own terminal goes
 * raw but keeps OPOST) only after the process has started, so early output would come out
 * different from later output, and early input would be echoed. So the process turns echo
 * off (stdout then holds only what the program writes) and stops itself; the caller resumes
 * it (SIGCONT) once runc has written its pid file, which runc does after that set-up.
 */
const TTY_GATE = 'stty -echo 2>/dev/null; kill -STOP $$';
const REDIRECT_INPUT = 'exec 0<&5 5<&-';

type ExecMode = 'pipes' | 'pipes+stdin' | 'tty' | 'detach';

export function execWrapper(mode: ExecMode, env: Record<string, string> = {}): string {
  // The wrapper shell sets SHLVL and (by its cd) OLDPWD: put them back as the caller had them.
  const restore = ['SHLVL', 'OLDPWD'].map((k) => (k in env ? `export ${k}=${shellQuote(env[k])}` : `unset ${k}`)).join('; ');
  const body = (mode === 'detach' ? EXEC_WRAPPER_DETACHED : EXEC_WRAPPER).replace(WRAPPER_RESTORE_MARK, restore);
  switch (mode) {
    case 'pipes':
      return [REDIRECT_OUTPUT, body].join('\n');
    case 'pipes+stdin':
      return [REDIRECT_OUTPUT, REDIRECT_INPUT, body].join('\n');
    case 'tty':
      return [TTY_GATE, body].join('\n');
    default:
      return body;
  }
}
/**
 * The detached variant: the process is started in the background in a session of its own,
 * with /dev/null for stdio, and its (in-box) pid printed. Its parent is then the wrapper
 * shell inside the box, so when that exits it is re-parented to the box's init (tini) rather
 * than to the host's PID 1 (which is what `runc exec -d` does, and which reaps late).
 */
export const EXEC_WRAPPER_DETACHED = [
  ...WRAPPER_PREAMBLE,
  `setsid ${BOX_BUSYBOX} sh -c 'exec -a "$0" "$@"' "$c" "$p" "$@" </dev/null >/dev/null 2>&1 &`,
  'echo "$!"',
].join('\n');

/** A word for sh: as it is when plain, else single-quoted. */
export function shellQuote(s: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** What the exec machinery needs of the runtime. */
export interface ExecContext {
  runcBin: string;
  /** runc's state directory (`runc --root`). */
  root: string;
  /** Where the pid files, runc logs and FIFOs of execs live. */
  execDir: string;
  containerId(boxId: string): string;
  bundlePath(boxId: string): string;
  cgroupsPath(boxId: string): string;
  /** The box's user namespace mapping (null: none). */
  idMap(boxId: string): Promise<IdMap | null>;
  /** The box's boxd (null: a box from before boxd, reached with `runc exec`). */
  agent(boxId: string): Promise<BoxdClient | null>;
  /** The error to report for one boxd gave (a box that is not running says so). */
  explain(boxId: string, e: unknown): Promise<unknown>;
}

interface Prepared {
  opts: ExecStreamOptions;
  cwd: string;
  env: Record<string, string>;
  user: ResolvedUser;
  idMap: IdMap | null;
  /** For boxd: the user as the caller named it, resolved inside the box. */
  userSpec?: string;
}

/** Runs processes in boxes through their boxd, or with `runc exec` in a box from before boxd;
 *  streamed or collected. */
export class RuncExec {
  private fifoPool: string[] = [];
  private fifoFill?: Promise<void>;

  constructor(private readonly ctx: ExecContext) {}

  /**
   * Runs a command and collects its output. The process (and its group) is killed when the
   * caller's `signal` aborts (exit code 137) and when an output passes EXEC_OUTPUT_CAP_BYTES
   * (`truncated`): a process that writes on and on must not keep a host busy for nothing.
   */
  async exec(boxId: string, opts: ExecOptions): Promise<ExecResult> {
    if (opts.detach) return this.execDetached(boxId, opts);
    const { command, cwd, env, user, tty, timeoutMs, stdin: input } = opts;
    const cap = new AbortController();
    const signal = opts.signal ? AbortSignal.any([opts.signal, cap.signal]) : cap.signal;
    // A terminal gets the input typed, then ^D; with no input nothing is typed.
    const streamOpts = { command, cwd, env, user, tty, timeoutMs, stdin: input !== undefined && (!tty || input.length > 0) };
    const proc = await this.start(boxId, streamOpts, tty ? 'tty' : streamOpts.stdin ? 'pipes+stdin' : 'pipes', signal);
    proc.stdin?.end(input);
    return { ...(await collect(proc, () => cap.abort())), detached: false };
  }

  stream(boxId: string, opts: ExecStreamOptions): Promise<ExecProcess> {
    return this.start(boxId, opts, opts.tty ? 'tty' : opts.stdin ? 'pipes+stdin' : 'pipes', opts.signal);
  }

  private async execDetached(boxId: string, opts: ExecOptions): Promise<ExecResult> {
    const { command, cwd, env, user } = opts;
    const agent = await this.ctx.agent(boxId);
    if (agent) {
      const req = await this.prepare(boxId, { command, cwd, env, user }, agent);
      const pid = await this.explained(boxId, agent.execDetached(this.boxdRequest(req, 'detach')));
      return { exitCode: -1, stdout: '', stderr: '', pid, detached: true, truncated: false };
    }
    const res = await collect(await this.start(boxId, { command, cwd, env, user, timeoutMs: 30_000 }, 'detach'));
    if (res.exitCode !== 0) {
      throw new ExecInputError(`could not start the detached process (exit ${res.exitCode}): ${res.stderr.trim().slice(0, 500)}`);
    }
    const nsPid = Number(res.stdout.trim());
    const pid = Number.isInteger(nsPid) && nsPid > 0 ? await this.hostPidOf(boxId, nsPid) : 0;
    return { exitCode: -1, stdout: '', stderr: '', pid, detached: true, truncated: false };
  }

  /**
   * Checks the options, resolves the user, and starts `runc exec` with the wrapper. What the
   * process is (command, environment, user) goes to runc in a `--process` file (0600, removed
   * once runc has read it), never on its command line, where any host user could read the
   * box's environment in /proc/<pid>/cmdline.
   */
  private async prepare(boxId: string, opts: ExecStreamOptions, agent: BoxdClient | null): Promise<Prepared> {
    if (!Array.isArray(opts.command) || opts.command.length === 0 || opts.command[0] === '') {
      throw new ExecInputError('command must not be empty');
    }
    if (opts.command.some((a) => typeof a !== 'string' || a.includes('\0'))) throw new ExecInputError('command arguments must be strings without NUL');
    const cwd = opts.cwd ?? '/';
    if (typeof cwd !== 'string' || !cwd.startsWith('/') || cwd.includes('\0')) throw new ExecInputError('cwd must be an absolute path', 'cwd');
    const env: Record<string, string> = { ...(await this.storedEnvironment(boxId)), ...(opts.env ?? {}) };
    try {
      validateEnvironment(env);
    } catch (e) {
      throw new ExecInputError((e as Error).message, 'env');
    }
    if (opts.timeoutMs !== undefined && !(opts.timeoutMs > 0)) throw new ExecInputError('timeout must be positive', 'timeout');

    const named = opts.user !== undefined && opts.user !== '';
    const idMap = await this.ctx.idMap(boxId);
    // boxd (1.1.0 on) resolves a user in the box itself and checks it against the box's id range.
    const resolves = agent && named ? await this.explained(boxId, agent.resolvesUsers()) : false;
    if (agent && (!named || resolves)) {
      return { opts, cwd, env, user: { uid: 0, gid: 0, groups: [] }, idMap, userSpec: named ? opts.user : undefined };
    }
    const user: ResolvedUser = named ? await resolveUser(opts.user!, (o) => this.exec(boxId, o)) : { uid: 0, gid: 0, groups: [] };
    if (idMap && [user.uid, user.gid, ...user.groups].some((id) => id >= idMap.size)) {
      throw new ExecInputError(`user ${opts.user} is not an id of the box (0…${idMap.size - 1})`, 'user');
    }
    return { opts, cwd, env, user, idMap };
  }

  /** What boxd is asked to run (the box's environment merged with the call's, PATH first). */
  private boxdRequest(p: Prepared, mode: ExecMode): BoxdExecRequest {
    const env = mode === 'tty' ? { ...p.env, TERM: p.env.TERM ?? 'xterm' } : p.env;
    return {
      v: BOXD_PROTOCOL,
      argv: p.opts.command,
      env: processEnv(env),
      cwd: p.cwd,
      uid: p.user.uid,
      gid: p.user.gid,
      groups: p.user.groups,
      tty: mode === 'tty',
      echo: false,
      cols: 80,
      rows: 24,
      stdin: p.opts.stdin === true,
      detach: mode === 'detach',
      timeoutMs: p.opts.timeoutMs ?? 0,
      user: p.userSpec,
      ...(p.opts.noHup ? { noHup: true } : {}),
    };
  }

  /** `p`, its failure explained (a box that stopped meanwhile is not running, not an agent down). */
  private async explained<T>(boxId: string, p: Promise<T>): Promise<T> {
    try {
      return await p;
    } catch (e) {
      throw await this.ctx.explain(boxId, e);
    }
  }

  private async start(boxId: string, opts: ExecStreamOptions, mode: ExecMode, signal?: AbortSignal): Promise<ExecProcess> {
    const agent = await this.ctx.agent(boxId);
    if (opts.noHup) {
      // Only boxd lets go of a process (1.3.0 on): asked first, before any work for the call.
      if (!agent) throw new BoxNeedsRestartError('the box was started before its agent (boxd) existed: stop and resume it to use no_hup sessions');
      if (!(await this.explained(boxId, agent.atLeast(1, 3)))) throw new BoxNeedsRestartError("the box's agent predates sessions that outlive their socket (no_hup): stop and resume the box to use them");
    }
    const p = await this.prepare(boxId, opts, agent);
    if (agent) {
      const proc = agent.exec(this.boxdRequest(p, mode), signal);
      const exited = this.explained(boxId, proc.exited);
      exited.catch(() => undefined);
      return { ...proc, exited };
    }
    const { cwd, env, user, idMap } = p;
    const cid = this.ctx.containerId(boxId);
    await fs.promises.mkdir(this.ctx.execDir, { recursive: true, mode: 0o700 });
    const tag = crypto.randomBytes(8).toString('hex');
    const pidFile = path.join(this.ctx.execDir, `${tag}.pid`);
    const logFile = path.join(this.ctx.execDir, `${tag}.log`);
    const processFile = path.join(this.ctx.execDir, `${tag}.json`);
    const args = [BOX_BUSYBOX, 'sh', '-c', execWrapper(mode, env), 'boxhost-exec', cwd, ...opts.command];
    const processEnvironment = mode === 'tty' ? { ...env, TERM: env.TERM ?? 'xterm' } : env;
    const withStdin = opts.stdin === true;
    const [fifos] = await Promise.all([
      mode === 'pipes' || mode === 'pipes+stdin' ? this.takeFifos(withStdin ? 3 : 2) : Promise.resolve([]),
      fs.promises.writeFile(processFile, JSON.stringify(processSpec(args, processEnvironment, user, mode === 'tty')), { mode: 0o600 }),
    ]);

    const runcArgs = ['--root', this.ctx.root, '--log', logFile, '--log-format', 'json', 'exec', '--pid-file', pidFile, '--process', processFile];
    if (mode === 'pipes') runcArgs.push('--preserve-fds', '2');
    if (mode === 'pipes+stdin') runcArgs.push('--preserve-fds', '3');
    runcArgs.push(cid);
    // The box process reopens its stdio (`> /dev/stderr` is /proc/self/fd/2): in a user
    // namespace only a FIFO owned by an id it maps (its own user) lets it.
    const owner = idMap ? { uid: idMap.hostId + user.uid, gid: idMap.hostId + user.gid } : null;
    // From the spawn to the exit listener synchronously: a process that ends at once (a bad
    // cwd) must not exit unheard.
    const spawned = this.spawnRunc(runcArgs, mode, fifos, owner);
    return superviseExec({ ...spawned, tty: mode === 'tty', stdin: withStdin, timeoutMs: opts.timeoutMs, cwd, pidFile, logFile, processFile, signal });
  }

  private async storedEnvironment(boxId: string): Promise<Record<string, string>> {
    try {
      return JSON.parse(await fs.promises.readFile(path.join(this.ctx.bundlePath(boxId), 'environment.json'), 'utf8'));
    } catch {
      return {};
    }
  }

  /** Fresh FIFOs for an exec's stdio, made in batches (one `mkfifo` per 32: Node has none). */
  private async takeFifos(n: number): Promise<string[]> {
    while (this.fifoPool.length < n) {
      this.fifoFill ??= (async () => {
        await fs.promises.mkdir(this.ctx.execDir, { recursive: true, mode: 0o700 });
        const base = path.join(this.ctx.execDir, `fifo-${crypto.randomBytes(6).toString('hex')}`);
        const paths = Array.from({ length: 32 }, (_, i) => `${base}-${i}`);
        await run(['mkfifo', '-m', '600', ...paths]);
        this.fifoPool.push(...paths);
      })().finally(() => (this.fifoFill = undefined));
      await this.fifoFill;
    }
    return this.fifoPool.splice(0, n);
  }

  /** The host pid of a process of the box known by its pid inside the box (0: gone). */
  private async hostPidOf(boxId: string, nsPid: number): Promise<number> {
    const rel = this.ctx.cgroupsPath(boxId).slice(1);
    for (const controller of ['pids', 'memory', 'cpu', '']) {
      let procs: string;
      try {
        procs = await fs.promises.readFile(path.join('/sys/fs/cgroup', controller, rel, 'cgroup.procs'), 'utf8');
      } catch {
        continue;
      }
      for (const p of procs.split('\n').filter(Boolean)) {
        try {
          const status = await fs.promises.readFile(`/proc/${p}/status`, 'utf8');
          const m = /^NSpid:\s+(.*)$/m.exec(status);
          const ids = m ? m[1].trim().split(/\s+/).map(Number) : [];
          if (ids.length > 1 && ids[ids.length - 1] === nsPid) return Number(p);
        } catch {
          /* exited meanwhile */
        }
      }
      return 0;
    }
    return 0;
  }

  /** Spawns runc (under `script` for a tty) with the process's stdio wired to Node streams;
   *  for pipes, through `fifos` (removed here). */
  private spawnRunc(args: string[], mode: ExecMode, fifos: string[], owner: { uid: number; gid: number } | null): { child: ChildProcess; out: net.Socket; err: net.Socket; input: net.Socket | null } {
    if (mode === 'tty') {
      // runc's foreground `exec -t` needs a terminal of its own to relay the box's pty to; it
      // gets one from util-linux `script` (its stdout is our pipe). The outer terminal gets a
      // size (runc copies it to the box's pty) and is made raw before runc starts (runc does
      // it too, but only after it has begun copying: early output would get a second CR), so
      // bytes pass through unchanged. Everything arrives on stdout; stderr stays empty.
      const cmd = `stty raw -echo cols 80 rows 24 2>/dev/null; exec ${[this.ctx.runcBin, ...args].map(shellQuote).join(' ')}`;
      const child = spawn(SCRIPT_BIN, ['--quiet', '--return', '--command', cmd, '/dev/null'], {
        detached: true,
        stdio: ['pipe', 'pipe', 'pipe'],
        env: { ...process.env, SHELL: '/bin/sh' },
      });
      return { child, out: child.stdout as net.Socket, err: child.stderr as net.Socket, input: child.stdin as net.Socket };
    }
    if (mode === 'detach') {
      const child = spawn(this.ctx.runcBin, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      return { child, out: child.stdout as net.Socket, err: child.stderr as net.Socket, input: null };
    }
    // Its own process group: on timeout the whole group (runc and the box process) is killed.
    // The process's stdio are fds 3, 4 (and 5) of runc (see execWrapper), and real pipes
    // (FIFOs), not the socket pairs Node makes: `echo x > /dev/stderr` must work in a box.
    const { O_RDONLY, O_WRONLY, O_NONBLOCK } = fs.constants;
    const childFds: number[] = [];
    try {
      if (owner) for (const f of fifos) fs.chownSync(f, owner.uid, owner.gid);
      const out = new net.Socket({ fd: fs.openSync(fifos[0], O_RDONLY | O_NONBLOCK), readable: true, writable: false });
      childFds.push(fs.openSync(fifos[0], O_WRONLY)); // a reader is there: does not block
      const err = new net.Socket({ fd: fs.openSync(fifos[1], O_RDONLY | O_NONBLOCK), readable: true, writable: false });
      childFds.push(fs.openSync(fifos[1], O_WRONLY));
      let input: net.Socket | null = null;
      if (fifos.length === 3) {
        const tmpR = fs.openSync(fifos[2], O_RDONLY | O_NONBLOCK);
        input = new net.Socket({ fd: fs.openSync(fifos[2], O_WRONLY), readable: false, writable: true });
        // The box's end must block like any stdin: reopen the FIFO without O_NONBLOCK (a
        // writer is there, so this does not wait either).
        childFds.push(fs.openSync(`/proc/self/fd/${tmpR}`, O_RDONLY));
        fs.closeSync(tmpR);
      }
      const child = spawn(this.ctx.runcBin, args, { detached: true, stdio: ['ignore', 'ignore', 'ignore', ...childFds] });
      return { child, out, err, input };
    } finally {
      for (const fd of childFds) fs.closeSync(fd);
      for (const f of fifos) fs.rmSync(f, { force: true });
    }
  }
}

class OutputCollector {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(
    private readonly cap: number,
    private readonly onFull: () => void,
  ) {}
  push(b: Buffer): void {
    if (b.length === 0 || this.truncated) return;
    const room = this.cap - this.size;
    if (b.length > room) {
      this.chunks.push(b.subarray(0, room));
      this.size += room;
      this.truncated = true;
      this.onFull();
    } else {
      this.chunks.push(b);
      this.size += b.length;
    }
  }
  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

/** Reads a process's output to its end, each stream capped at EXEC_OUTPUT_CAP_BYTES; `onFull`
 *  is called when one passes it. */
async function collect(proc: ExecProcess, onFull: () => void = () => undefined): Promise<Omit<ExecResult, 'detached'>> {
  const out = new OutputCollector(EXEC_OUTPUT_CAP_BYTES, onFull);
  const err = new OutputCollector(EXEC_OUTPUT_CAP_BYTES, onFull);
  proc.stdout.on('data', (b: Buffer) => out.push(b));
  proc.stderr.on('data', (b: Buffer) => err.push(b));
  const ended = (s: Readable) => new Promise<void>((resolve) => s.once('end', resolve).once('close', resolve));
  const [{ exitCode }] = await Promise.all([proc.exited, ended(proc.stdout), ended(proc.stderr)]);
  return { exitCode, stdout: out.text(), stderr: err.text(), pid: await proc.pid(), truncated: out.truncated || err.truncated };
}


/**
 * The OCI process `runc exec --process` runs: the box's capabilities, rlimits and no new
 * privileges, as its PID 1 has (runc takes a process file as it is: without `noNewPrivileges`
 * it would leave it off, without rlimits the process would keep runc's); the OOM score is the
 * container's.
 */
function processSpec(args: string[], env: Record<string, string>, user: ResolvedUser, terminal: boolean): Record<string, unknown> {
  return {
    terminal,
    user: { uid: user.uid, gid: user.gid, ...(user.groups.length ? { additionalGids: user.groups } : {}) },
    args,
    env: processEnv(env),
    cwd: '/',
    capabilities: { bounding: DEFAULT_CAPABILITIES, effective: DEFAULT_CAPABILITIES, permitted: DEFAULT_CAPABILITIES },
    rlimits: boxRlimits(),
    noNewPrivileges: true,
  };
}
