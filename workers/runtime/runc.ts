import { ChildProcess, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { CommandError, run, sleep } from '../../core/command';
import type { ContainerSpec, ContainerStatus, DriverLogger, ExecOptions, ExecResult, RuntimeDriver } from '../drivers';
import { BOX_BUSYBOX, buildOciSpec, validateEnvironment } from './ociSpec';
import { BoxNotRunningError, ExecInputError } from '../errors';

export { BoxNotRunningError, ExecInputError };

/** Each of stdout and stderr of an exec is kept up to this many bytes; the rest is dropped. */
export const EXEC_OUTPUT_CAP_BYTES = 16 * 1024 * 1024;

export const RUNC_BIN = '/usr/sbin/runc';
export const TINI_BIN = '/usr/bin/tini-static';
export const BUSYBOX_BIN = '/usr/bin/busybox';
export const SCRIPT_BIN = '/usr/bin/script';

export interface RuncRuntimeOptions {
  dataDir: string;
  hostTag: string;
  logger?: DriverLogger;
  runc?: string;
  tini?: string;
  busybox?: string;
}

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
  'if ! cd -- "$1" 2>/dev/null; then echo "boxhost-exec: cannot enter working directory" >&2; exit 211; fi',
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
export function execWrapper(mode: 'pipes' | 'pipes+stdin' | 'tty' | 'detach', env: Record<string, string> = {}): string {
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
type ExecMode = 'pipes' | 'pipes+stdin' | 'tty' | 'detach';
const CWD_FAILED_CODE = 211;
const CWD_FAILED_MARK = 'boxhost-exec: cannot enter working directory';

const BOX_ID_RE = /^[a-z0-9]{1,32}$/;

export function shellQuote(s: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** `/etc/boxes-env`: `KEY=value` lines, values shell-quoted, one per key, sorted. */
export function renderBoxesEnv(environment: Record<string, string>): string {
  validateEnvironment(environment);
  return Object.keys(environment)
    .sort()
    .map((k) => `${k}=${`'${environment[k].replace(/'/g, `'\\''`)}'`}\n`)
    .join('');
}

/** cgroup v1 without swap accounting has no memsw files: then no swap limit can be set. */
function hostAccountsSwap(): boolean {
  if (!fs.existsSync('/sys/fs/cgroup/memory')) return true; // cgroup v2: runc maps it
  return fs.existsSync('/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes');
}

/** The host's hard RLIMIT_NOFILE (a box may not ask for more). */
function hostNofileHard(): number {
  try {
    const limits = fs.readFileSync('/proc/self/limits', 'utf8');
    const m = /^Max open files\s+\S+\s+(\S+)/m.exec(limits);
    if (m && m[1] !== 'unlimited') return Number(m[1]);
  } catch {
    /* fall through */
  }
  return 1024;
}

class OutputCollector {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly cap: number) {}
  push(b: Buffer): void {
    if (this.size >= this.cap) {
      if (b.length) this.truncated = true;
      return;
    }
    const room = this.cap - this.size;
    if (b.length > room) {
      this.chunks.push(b.subarray(0, room));
      this.size += room;
      this.truncated = true;
    } else {
      this.chunks.push(b);
      this.size += b.length;
    }
  }
  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
}

function parsePasswd(text: string): PasswdEntry[] {
  const out: PasswdEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 4 || !f[0] || !/^\d+$/.test(f[2]) || !/^\d+$/.test(f[3])) continue;
    out.push({ name: f[0], uid: Number(f[2]), gid: Number(f[3]) });
  }
  return out;
}

function parseGroup(text: string): { name: string; gid: number; members: string[] }[] {
  const out: { name: string; gid: number; members: string[] }[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 3 || !f[0] || !/^\d+$/.test(f[2])) continue;
    out.push({ name: f[0], gid: Number(f[2]), members: (f[3] ?? '').split(',').map((s) => s.trim()).filter(Boolean) });
  }
  return out;
}

const MAX_ID = 2 ** 32 - 2;

export class RuncRuntime implements RuntimeDriver {
  readonly dataDir: string;
  readonly hostTag: string;
  /** runc's state directory (`runc --root`). */
  readonly root: string;
  readonly bundlesDir: string;
  private readonly execDir: string;
  private readonly runcBin: string;
  private readonly tini: string;
  private readonly busybox: string;
  private readonly logger?: DriverLogger;

  constructor(opts: RuncRuntimeOptions) {
    if (!/^[a-z0-9]{1,16}$/.test(opts.hostTag)) throw new Error(`invalid host tag ${opts.hostTag}`);
    this.dataDir = path.resolve(opts.dataDir);
    this.hostTag = opts.hostTag;
    this.root = path.join(this.dataDir, 'runc');
    this.bundlesDir = path.join(this.dataDir, 'bundles');
    this.execDir = path.join(this.dataDir, 'exec');
    this.runcBin = opts.runc ?? RUNC_BIN;
    this.tini = opts.tini ?? TINI_BIN;
    this.busybox = opts.busybox ?? BUSYBOX_BIN;
    this.logger = opts.logger;
  }

  /** The runc container id of a box: unique per host tag, deterministic. */
  containerId(boxId: string): string {
    this.checkBoxId(boxId);
    return `bh${this.hostTag}-${boxId}`;
  }

  /** The box id of one of this host's container ids, else null. */
  boxIdOf(containerId: string): string | null {
    const prefix = `bh${this.hostTag}-`;
    if (!containerId.startsWith(prefix)) return null;
    const id = containerId.slice(prefix.length);
    return BOX_ID_RE.test(id) ? id : null;
  }

  bundlePath(boxId: string): string {
    this.checkBoxId(boxId);
    return path.join(this.bundlesDir, boxId);
  }

  /** cgroups v1 path (the same under every controller): one flat directory per box. */
  cgroupsPath(boxId: string): string {
    return `/${this.containerId(boxId)}`;
  }

  private checkBoxId(boxId: string): void {
    if (!BOX_ID_RE.test(boxId)) throw new Error(`invalid box id ${JSON.stringify(boxId)}`);
  }

  private runc(args: string[], opts: { allowFailure?: boolean; input?: string; timeoutMs?: number } = {}) {
    return run([this.runcBin, '--root', this.root, ...args], { allowFailure: opts.allowFailure, input: opts.input, timeoutMs: opts.timeoutMs ?? 60_000 });
  }

  // ---------------------------------------------------------------- lifecycle

  async start(spec: ContainerSpec): Promise<void> {
    const cid = this.containerId(spec.boxId);
    const current = await this.status(spec.boxId);
    if (current === 'running' || current === 'paused') return;
    if (current !== null) {
      // created (a start that died half-way) or stopped: make it anew.
      await this.runc(['delete', '--force', cid], { allowFailure: true });
    }
    // Cgroups left by an earlier container of this box would carry its limits over; a box
    // that never ran has none, and looking in each controller costs a few ms.
    if (current !== null || this.hasCgroupLeftovers(spec.boxId)) await this.removeCgroups(spec.boxId);

    const bundle = this.bundlePath(spec.boxId);
    await Promise.all([fs.promises.mkdir(bundle, { recursive: true, mode: 0o700 }), fs.promises.mkdir(this.root, { recursive: true, mode: 0o700 })]);
    const config = buildOciSpec({
      rootfs: path.resolve(spec.rootfs),
      hostname: spec.hostname,
      netnsPath: spec.netnsPath,
      cgroupsPath: this.cgroupsPath(spec.boxId),
      cpus: spec.cpus,
      ramMb: spec.ramMb,
      environment: spec.environment,
      // /etc/hostname and /etc/boxes-env are files of the bundle, bind-mounted read-only (as
      // Docker mounts /etc/hostname): nothing is written into the box's root at start, which on
      // the ZFS (FUSE) root costs ≈15 ms, and the box cannot alter what the API manages.
      mounts: [
        ...spec.mounts,
        { source: path.join(bundle, 'hostname'), destination: '/etc/hostname', readOnly: true },
        { source: path.join(bundle, 'boxes-env'), destination: '/etc/boxes-env', readOnly: true },
      ],
      tiniPath: this.tini,
      busyboxPath: this.busybox,
      nofileHard: hostNofileHard(),
      memorySwap: hostAccountsSwap(),
      annotations: { 'boxhost.box-id': spec.boxId, 'boxhost.host-tag': this.hostTag },
    });
    await Promise.all([
      writeJsonAtomic(path.join(bundle, 'config.json'), config),
      writeJsonAtomic(path.join(bundle, 'environment.json'), spec.environment),
      fs.promises.writeFile(path.join(bundle, 'hostname'), `${spec.hostname}\n`, { mode: 0o644 }),
      fs.promises.writeFile(path.join(bundle, 'boxes-env'), renderBoxesEnv(spec.environment), { mode: 0o644 }),
    ]);

    const t0 = Date.now();
    const code = await runDetached(this.runcBin, this.root, bundle, cid);
    if (code !== 0) {
      const tail = await readTail(path.join(bundle, 'container.log'), 2000);
      const again = await this.status(spec.boxId);
      if (again === 'running') return; // a concurrent start won
      throw new CommandError([this.runcBin, 'run', '--detach', cid], code, '', tail);
    }
    this.logger?.debug({ boxId: spec.boxId, ms: Date.now() - t0 }, 'runc run');
  }

  async status(boxId: string): Promise<ContainerStatus | null> {
    const cid = this.containerId(boxId);
    // runc keeps a container's state in <root>/<id>/state.json: without it there is no
    // container, and asking runc (≈10 ms) would only say so.
    if (!fs.existsSync(path.join(this.root, cid, 'state.json'))) return null;
    const res = await this.runc(['state', cid], { allowFailure: true });
    if (res.exitCode !== 0) {
      if (/does not exist|not exist|no such file/i.test(res.stderr)) return null;
      throw new CommandError([this.runcBin, 'state', cid], res.exitCode, res.stdout, res.stderr);
    }
    const state = JSON.parse(res.stdout) as { status: string };
    return normalizeStatus(state.status);
  }

  async stop(boxId: string, graceSeconds: number): Promise<void> {
    const cid = this.containerId(boxId);
    let st = await this.status(boxId);
    if (st === 'paused') {
      await this.runc(['resume', cid], { allowFailure: true });
      st = await this.status(boxId);
    }
    if (st === 'running') {
      await this.runc(['kill', cid, 'TERM'], { allowFailure: true });
      st = await this.waitStopped(boxId, Math.max(0, graceSeconds) * 1000);
      if (st !== 'stopped' && st !== null) {
        await this.runc(['kill', cid, 'KILL'], { allowFailure: true });
        st = await this.waitStopped(boxId, 10_000);
      }
    }
    if (st !== null) {
      const res = await this.runc(['delete', '--force', cid], { allowFailure: true });
      if (res.exitCode !== 0 && (await this.status(boxId)) !== null) {
        throw new CommandError([this.runcBin, 'delete', '--force', cid], res.exitCode, res.stdout, res.stderr);
      }
    }
    await this.removeCgroups(boxId);
  }

  private async waitStopped(boxId: string, ms: number): Promise<ContainerStatus | null> {
    const deadline = Date.now() + ms;
    for (;;) {
      const st = await this.status(boxId);
      if (st === 'stopped' || st === null || Date.now() >= deadline) return st;
      await sleep(25);
    }
  }

  async remove(boxId: string): Promise<void> {
    const cid = this.containerId(boxId);
    if ((await this.status(boxId)) !== null) {
      await this.runc(['delete', '--force', cid], { allowFailure: true });
      if ((await this.status(boxId)) !== null) {
        await this.stop(boxId, 0);
      }
    }
    await this.removeCgroups(boxId);
    await fs.promises.rm(this.bundlePath(boxId), { recursive: true, force: true });
  }

  /** runc leaves cgroup directories behind in some cases; remove ours (only when empty). */
  private cgroupControllers?: string[];

  private hasCgroupLeftovers(boxId: string): boolean {
    const rel = this.cgroupsPath(boxId).slice(1);
    try {
      this.cgroupControllers ??= fs.readdirSync('/sys/fs/cgroup');
    } catch {
      return false;
    }
    return ['', ...this.cgroupControllers].some((c) => fs.existsSync(path.join('/sys/fs/cgroup', c, rel)));
  }

  private async removeCgroups(boxId: string): Promise<void> {
    const rel = this.cgroupsPath(boxId).slice(1);
    let controllers: string[];
    try {
      controllers = await fs.promises.readdir('/sys/fs/cgroup');
    } catch {
      return;
    }
    for (const c of ['', ...controllers]) {
      await rmdirTree(path.join('/sys/fs/cgroup', c, rel)).catch((e) =>
        this.logger?.warn({ err: String(e), boxId, controller: c }, 'cannot remove cgroup'),
      );
    }
  }

  async update(boxId: string, limits: { cpus?: number; ramMb?: number }): Promise<void> {
    const cid = this.containerId(boxId);
    const args = ['update'];
    if (limits.ramMb !== undefined) {
      if (!(limits.ramMb >= 4)) throw new RangeError('ramMb must be at least 4');
      const bytes = String(Math.round(limits.ramMb * 1024 * 1024));
      // Both together: raising the memory limit alone fails (memsw must move first) and can
      // leave runc's state.json inconsistent.
      args.push('--memory', bytes);
      if (hostAccountsSwap()) args.push('--memory-swap', bytes);
    }
    if (limits.cpus !== undefined) {
      const quota = limits.cpus > 0 ? Math.max(1000, Math.round(limits.cpus * 100_000)) : -1;
      args.push('--cpu-period', '100000', '--cpu-quota', String(quota));
    }
    if (args.length === 1) return;
    args.push(cid);
    await this.runc(args);
    // Keep the bundle in step, so that a later look at config.json tells the truth.
    try {
      const file = path.join(this.bundlePath(boxId), 'config.json');
      const config = JSON.parse(await fs.promises.readFile(file, 'utf8'));
      const res = (config.linux.resources ??= {});
      if (limits.ramMb !== undefined) res.memory = { limit: Number(args[args.indexOf('--memory') + 1]), swap: Number(args[args.indexOf('--memory') + 1]) };
      if (limits.cpus !== undefined) {
        if (limits.cpus > 0) res.cpu = { quota: Number(args[args.indexOf('--cpu-quota') + 1]), period: 100000 };
        else delete res.cpu;
      }
      await writeJsonAtomic(file, config);
    } catch {
      /* the bundle is rewritten at the next start anyway */
    }
  }

  async list(): Promise<{ boxId: string; status: ContainerStatus }[]> {
    await fs.promises.mkdir(this.root, { recursive: true, mode: 0o700 });
    const res = await this.runc(['list', '--format', 'json']);
    const items = (JSON.parse(res.stdout.trim() || 'null') ?? []) as { id: string; status: string }[];
    const out: { boxId: string; status: ContainerStatus }[] = [];
    for (const it of items) {
      const boxId = this.boxIdOf(it.id);
      if (boxId) out.push({ boxId, status: normalizeStatus(it.status) });
    }
    return out;
  }

  /**
   * Rewrites /etc/boxes-env of the box whose root is `rootfs`. In a running box the file is
   * written from inside (so the box's own symlinks resolve inside it); in a stopped one from
   * the host with symlinks refused. Later execs get the new environment too.
   */
  async writeEnvironment(boxId: string, environment: Record<string, string>): Promise<void> {
    const bundle = this.bundlePath(boxId);
    await fs.promises.mkdir(bundle, { recursive: true, mode: 0o700 });
    await writeJsonAtomic(path.join(bundle, 'environment.json'), environment);
    // Written in place, not renamed over: a running box's bind mount holds this very inode.
    await fs.promises.writeFile(path.join(bundle, 'boxes-env'), renderBoxesEnv(environment), { mode: 0o644 });
  }

  // ---------------------------------------------------------------- exec

  async exec(boxId: string, opts: ExecOptions): Promise<ExecResult> {
    const cid = this.containerId(boxId);
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

    const user = opts.user !== undefined && opts.user !== '' ? await this.resolveUser(boxId, opts.user) : null;

    await fs.promises.mkdir(this.execDir, { recursive: true, mode: 0o700 });
    const tag = crypto.randomBytes(8).toString('hex');
    const pidFile = path.join(this.execDir, `${tag}.pid`);
    const logFile = path.join(this.execDir, `${tag}.log`);

    const args = ['--root', this.root, '--log', logFile, '--log-format', 'json', 'exec', '--pid-file', pidFile, '--cwd', '/'];
    if (user) {
      args.push('--user', `${user.uid}:${user.gid}`);
      for (const g of user.groups) args.push('--additional-gids', String(g));
    }
    for (const [k, v] of Object.entries(env)) args.push('--env', `${k}=${v}`);
    const mode: ExecMode = opts.detach ? 'detach' : opts.tty ? 'tty' : opts.stdin !== undefined ? 'pipes+stdin' : 'pipes';
    if (mode === 'tty') args.push('--tty', '--env', `TERM=${env.TERM ?? 'xterm'}`);
    if (mode === 'pipes') args.push('--preserve-fds', '2');
    if (mode === 'pipes+stdin') args.push('--preserve-fds', '3');
    args.push(cid, BOX_BUSYBOX, 'sh', '-c', execWrapper(mode, env), 'boxhost-exec', cwd, ...opts.command);

    try {
      if (mode === 'detach') {
        const res = await this.execForeground(args, mode, { ...opts, stdin: undefined, timeoutMs: 30_000 }, pidFile, logFile);
        if (res.exitCode !== 0) {
          throw new ExecInputError(`could not start the detached process (exit ${res.exitCode}): ${res.stderr.trim().slice(0, 500)}`);
        }
        const nsPid = Number(res.stdout.trim());
        const pid = Number.isInteger(nsPid) && nsPid > 0 ? await this.hostPidOf(boxId, nsPid) : 0;
        return { exitCode: -1, stdout: '', stderr: '', pid, detached: true, truncated: false };
      }
      return await this.execForeground(args, mode, opts, pidFile, logFile);
    } finally {
      await fs.promises.rm(pidFile, { force: true });
      await fs.promises.rm(logFile, { force: true });
    }
  }

  private async storedEnvironment(boxId: string): Promise<Record<string, string>> {
    try {
      return JSON.parse(await fs.promises.readFile(path.join(this.bundlePath(boxId), 'environment.json'), 'utf8'));
    } catch {
      return {};
    }
  }

  private fifoPool: string[] = [];
  private fifoFill?: Promise<void>;

  /** Fresh FIFOs for an exec's stdio, made in batches (one `mkfifo` per 32: Node has none). */
  private async takeFifos(n: number): Promise<string[]> {
    while (this.fifoPool.length < n) {
      this.fifoFill ??= (async () => {
        await fs.promises.mkdir(this.execDir, { recursive: true, mode: 0o700 });
        const base = path.join(this.execDir, `fifo-${crypto.randomBytes(6).toString('hex')}`);
        this.fifoPool.push(...(await makeFifos(base, 32)));
      })().finally(() => (this.fifoFill = undefined));
      await this.fifoFill;
    }
    return this.fifoPool.splice(0, n);
  }

  /** The host pid of a process of the box known by its pid inside the box (0: gone). */
  async hostPidOf(boxId: string, nsPid: number): Promise<number> {
    const rel = this.cgroupsPath(boxId).slice(1);
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

  private async execForeground(args: string[], mode: ExecMode, opts: ExecOptions, pidFile: string, logFile: string): Promise<ExecResult> {
    const tty = mode === 'tty';
    let child: ChildProcess;
    let stdout: Readable;
    let stderr: Readable;
    let stdin: Writable | null = null;
    if (tty) {
      // runc's foreground `exec -t` needs a terminal of its own to relay the box's pty to; it
      // gets one from util-linux `script` (its stdout is our pipe). The outer terminal gets a
      // size (runc copies it to the box's pty) and is made raw before runc starts (runc does
      // it too, but only after it has begun copying: early output would get a second CR), so
      // bytes pass through unchanged. Everything arrives on stdout; stderr stays empty.
      const cmd = `stty raw -echo cols 80 rows 24 2>/dev/null; exec ${[this.runcBin, ...args].map(shellQuote).join(' ')}`;
      child = spawn(SCRIPT_BIN, ['--quiet', '--return', '--command', cmd, '/dev/null'], {
        detached: true,
        stdio: ['pipe', 'pipe', 'pipe'],
        env: { ...process.env, SHELL: '/bin/sh' },
      });
      [stdout, stderr, stdin] = [child.stdout!, child.stderr!, child.stdin!];
    } else if (mode === 'detach') {
      child = spawn(this.runcBin, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      [stdout, stderr] = [child.stdout!, child.stderr!];
    } else {
      // Its own process group: on timeout the whole group (runc and the box process) is killed.
      // The process's stdio are fds 3, 4 (and 5) of runc (see execWrapper), and real pipes
      // (FIFOs), not the socket pairs Node makes: `echo x > /dev/stderr` must work in a box.
      const withStdin = mode === 'pipes+stdin';
      const fifos = await this.takeFifos(withStdin ? 3 : 2);
      const { O_RDONLY, O_WRONLY, O_NONBLOCK } = fs.constants;
      const childFds: number[] = [];
      try {
        const outR = fs.openSync(fifos[0], O_RDONLY | O_NONBLOCK);
        stdout = new net.Socket({ fd: outR, readable: true, writable: false });
        childFds.push(fs.openSync(fifos[0], O_WRONLY)); // a reader is there: does not block
        const errR = fs.openSync(fifos[1], O_RDONLY | O_NONBLOCK);
        stderr = new net.Socket({ fd: errR, readable: true, writable: false });
        childFds.push(fs.openSync(fifos[1], O_WRONLY));
        if (withStdin) {
          const tmpR = fs.openSync(fifos[2], O_RDONLY | O_NONBLOCK);
          const inW = fs.openSync(fifos[2], O_WRONLY);
          // The box's end must block like any stdin: reopen the FIFO without O_NONBLOCK (a
          // writer is there, so this does not wait either).
          childFds.push(fs.openSync(`/proc/self/fd/${tmpR}`, O_RDONLY));
          fs.closeSync(tmpR);
          stdin = new net.Socket({ fd: inW, readable: false, writable: true });
        }
        child = spawn(this.runcBin, args, {
          detached: true,
          stdio: ['ignore', 'ignore', 'ignore', ...childFds],
        });
      } finally {
        // Synchronously: nothing may await between spawn and the exit listener below, or a
        // process that ends at once (a bad cwd) exits unheard and the call never returns.
        for (const fd of childFds) fs.closeSync(fd);
        for (const f of fifos) fs.rmSync(f, { force: true });
      }
    }
    const out = new OutputCollector(EXEC_OUTPUT_CAP_BYTES);
    const err = new OutputCollector(EXEC_OUTPUT_CAP_BYTES);
    let lastData = Date.now();
    stdout.on('data', (b: Buffer) => {
      lastData = Date.now();
      out.push(b);
    });
    stderr.on('data', (b: Buffer) => {
      lastData = Date.now();
      err.push(b);
    });
    stdin?.on('error', () => {
      /* the process did not read its stdin: fine */
    });

    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve({ code: child.exitCode, signal: child.signalCode });
      child.on('error', reject);
      child.on('exit', (code, signal) => resolve({ code, signal }));
    });
    let done = false;
    void exited.then(() => (done = true), () => (done = true));

    if (!tty && stdin && opts.stdin !== undefined) stdin.end(opts.stdin);
    if (tty) {
      // Once runc has written the pid file its terminal set-up is done: resume the process
      // stopped in TTY_GATE, then type the input and EOF as the terminal's ^D. The pipe stays
      // open until the end (script would turn its end into a stray byte).
      void (async () => {
        let pid = 0;
        while (!done && !(pid = await readPid(pidFile))) await sleep(2);
        for (let i = 0; !done && i < 5000; i++) {
          const state = await processState(pid);
          if (state === null) return; // gone already
          if (state === 'T') break;
          await sleep(1);
        }
        if (done) return;
        try {
          process.kill(pid, 'SIGCONT');
        } catch {
          return;
        }
        const data = opts.stdin;
        if (data === undefined || data.length === 0) return;
        stdin!.write(data);
        stdin!.write(data[data.length - 1] === 0x0a ? '\x04' : '\x04\x04');
      })();
    }

    let timedOut = false;
    let timer: NodeJS.Timeout | undefined;
    let killer: NodeJS.Timeout | undefined;
    if (opts.timeoutMs !== undefined) {
      timer = setTimeout(() => {
        timedOut = true;
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
      }, opts.timeoutMs);
    }

    let result: { code: number | null; signal: NodeJS.Signals | null };
    try {
      result = await exited;
    } finally {
      if (timer) clearTimeout(timer);
      if (killer) clearInterval(killer);
    }
    // Children the timed-out process left in runc's process group go too.
    if (timedOut && !tty && child.pid) tryKill(-child.pid);
    // The box process has exited; a background child of it may still hold the pipes open.
    // Read what is there, then let go once output has been quiet for a moment.
    await this.drain([stdout, stderr], () => lastData);
    stdin?.destroy();

    if (!timedOut) await this.throwIfRuncFailed(logFile);
    const pid = await readPid(pidFile);
    let exitCode = result.code ?? (result.signal ? 128 + (signalNumber(result.signal) ?? 0) : -1);
    if (timedOut) exitCode = 124;
    const outText = out.text();
    const errText = err.text();
    if (!timedOut && exitCode === CWD_FAILED_CODE && (errText.trim() === CWD_FAILED_MARK || (tty && outText.trim() === CWD_FAILED_MARK))) {
      throw new ExecInputError(`working directory ${opts.cwd} does not exist in the box or cannot be entered`, 'cwd');
    }
    return { exitCode, stdout: outText, stderr: errText, pid, detached: false, truncated: out.truncated || err.truncated };
  }

  /** Waits for stdout and stderr to close; once the process is gone, a background child of
   *  it that still holds them open is not waited for past a quiet moment. */
  private drain(streams: Readable[], lastData: () => number): Promise<void> {
    return new Promise((resolve) => {
      const open = () => streams.filter((s) => !s.readableEnded && !s.destroyed);
      let pending = open().length;
      if (pending === 0) return resolve();
      const start = Date.now();
      let finished = false;
      const finish = () => {
        if (finished) return;
        finished = true;
        clearInterval(iv);
        for (const s of open()) s.destroy();
        resolve();
      };
      for (const s of open()) s.once('close', () => --pending === 0 && finish());
      const iv = setInterval(() => {
        if (Date.now() - Math.max(lastData(), start) > 200 || Date.now() - start > 3000) finish();
      }, 50);
    });
  }

  /** runc's own failure (as opposed to the process's exit code) is in its log file. */
  private async throwIfRuncFailed(logFile: string): Promise<void> {
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

  /**
   * `NAME`, `NAME:GROUP`, `UID`, `UID:GID`: names are looked up in the box's own /etc/passwd
   * and /etc/group, read by a process inside the box (so a symlink there resolves inside the
   * box, never on the host).
   */
  private async resolveUser(boxId: string, spec: string): Promise<{ uid: number; gid: number; groups: number[] }> {
    const m = /^([^:]+)(?::([^:]+))?$/.exec(spec);
    if (!m) throw new ExecInputError(`invalid user ${JSON.stringify(spec)}`, 'user');
    const [, u, g] = m;
    const isNum = (s: string) => /^\d+$/.test(s) && Number(s) <= MAX_ID;
    if (isNum(u) && g !== undefined && isNum(g)) return { uid: Number(u), gid: Number(g), groups: [] };
    if (!isNum(u) && !/^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$/.test(u)) throw new ExecInputError(`invalid user ${JSON.stringify(spec)}`, 'user');

    const { passwd, group } = await this.readAccounts(boxId);
    const users = parsePasswd(passwd);
    const groups = parseGroup(group);
    const entry = isNum(u) ? users.find((e) => e.uid === Number(u)) : users.find((e) => e.name === u);
    if (!entry && !isNum(u)) throw new ExecInputError(`unknown user ${JSON.stringify(u)} in the box`, 'user');
    const uid = entry ? entry.uid : Number(u);
    let gid = entry ? entry.gid : 0;
    if (g !== undefined) {
      if (isNum(g)) gid = Number(g);
      else {
        const ge = groups.find((e) => e.name === g);
        if (!ge) throw new ExecInputError(`unknown group ${JSON.stringify(g)} in the box`, 'user');
        gid = ge.gid;
      }
    }
    const extra = entry ? groups.filter((e) => e.members.includes(entry.name) && e.gid !== gid).map((e) => e.gid) : [];
    return { uid, gid, groups: [...new Set(extra)] };
  }

  private async readAccounts(boxId: string): Promise<{ passwd: string; group: string }> {
    const sep = '\n--boxhost-accounts-separator--\n';
    const res = await this.exec(boxId, {
      command: [BOX_BUSYBOX, 'sh', '-c', `head -c 1048576 /etc/passwd 2>/dev/null; printf '${sep.replace(/\n/g, '\\n')}'; head -c 1048576 /etc/group 2>/dev/null; true`],
      timeoutMs: 10_000,
    });
    if (res.exitCode !== 0) throw new Error(`reading the box's accounts failed (exit ${res.exitCode}): ${res.stderr.trim()}`);
    const i = res.stdout.lastIndexOf(sep);
    if (i < 0) return { passwd: res.stdout, group: '' };
    return { passwd: res.stdout.slice(0, i), group: res.stdout.slice(i + sep.length) };
  }
}

function normalizeStatus(s: string): ContainerStatus {
  switch (s) {
    case 'created':
    case 'running':
    case 'paused':
    case 'stopped':
      return s;
    case 'pausing':
      return 'running';
    default:
      return 'stopped';
  }
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.${crypto.randomBytes(4).toString('hex')}.tmp`;
  await fs.promises.writeFile(tmp, JSON.stringify(value, null, 1), { mode: 0o600 });
  await fs.promises.rename(tmp, file);
}

/** Makes `n` FIFOs next to `base` (Node has no mkfifo). */
async function makeFifos(base: string, n: number): Promise<string[]> {
  const paths = Array.from({ length: n }, (_, i) => `${base}-${i}`);
  await run(['mkfifo', '-m', '600', ...paths]);
  return paths;
}

async function readTail(file: string, bytes: number): Promise<string> {
  try {
    const buf = await fs.promises.readFile(file);
    return buf.subarray(Math.max(0, buf.length - bytes)).toString('utf8');
  } catch {
    return '';
  }
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

function tryKill(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    /* gone already */
  }
}

function signalNumber(sig: NodeJS.Signals): number | undefined {
  return os.constants.signals[sig];
}

/** rmdir a cgroup directory and its (empty) children, deepest first. Missing is fine. */
async function rmdirTree(dir: string): Promise<void> {
  let entries: fs.Dirent[];
  try {
    entries = await fs.promises.readdir(dir, { withFileTypes: true });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return;
    throw e;
  }
  for (const e of entries) if (e.isDirectory()) await rmdirTree(path.join(dir, e.name));
  try {
    await fs.promises.rmdir(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}

/**
 * `runc run --detach` with stdio to `<bundle>/container.log`, never pipes: the container
 * inherits them and the caller would hang. Answers runc's exit code.
 */
export async function runDetached(runcBin: string, root: string, bundle: string, id: string): Promise<number | null> {
  const log = await fs.promises.open(path.join(bundle, 'container.log'), 'a', 0o600);
  try {
    return await new Promise<number | null>((resolve, reject) => {
      const child = spawn(runcBin, ['--root', root, 'run', '--detach', '--bundle', bundle, id], { cwd: bundle, stdio: ['ignore', log.fd, log.fd] });
      child.on('error', reject);
      child.on('exit', (c) => resolve(c));
    });
  } finally {
    await log.close();
  }
}
