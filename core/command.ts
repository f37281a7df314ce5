import { spawn } from 'node:child_process';
import { spawnCollect, spawnerEnabled, SpawnerUnavailable } from './spawner';

/** A host tool (zfs, runc, ip, iptables, a CNI plugin) that exited non-zero. */
export class CommandError extends Error {
  constructor(
    readonly argv: string[],
    readonly exitCode: number | null,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`${argv.join(' ')} exited ${exitCode}: ${(stderr || stdout).trim().slice(0, 2000)}`);
  }
}

export interface RunOptions {
  input?: string | Buffer;
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
  /** Answer instead of throwing on a non-zero exit. */
  allowFailure?: boolean;
  /** A file held locked (flock(2), exclusive, across processes) from before the command starts
   *  until it ends. The wait for it is bounded by `timeoutMs` too, apart from the command's own
   *  run; a lock not free by then: not started, rejected (`isLockTimeout`). */
  lockFile?: string;
}

export interface RunResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a host command without a shell and collects its output (through the spawner when it is
 *  on: core/spawner.ts). */
export async function run(argv: string[], opts: RunOptions = {}): Promise<RunResult> {
  const viaHelper = spawnerEnabled() ? spawnCollect(argv, opts) : null;
  if (viaHelper) {
    try {
      const res = await viaHelper;
      if (res.exitCode !== 0 && !opts.allowFailure) throw new CommandError(argv, res.exitCode, res.stdout, res.stderr);
      return res;
    } catch (e) {
      if (!(e instanceof SpawnerUnavailable)) throw e;
    }
  }
  return runHere(argv, opts);
}

/** A command not started because its lock (RunOptions.lockFile) was not free before its deadline. */
export const isLockTimeout = (e: unknown): boolean => (e as NodeJS.ErrnoException)?.code === 'ETIMEDOUT' && (e as NodeJS.ErrnoException).syscall === 'flock';

function lockTimeout(argv: string[], opts: RunOptions): Error {
  return Object.assign(new Error(`${argv[0]} was not started: the lock ${opts.lockFile} was not free within ${opts.timeoutMs} ms`), { code: 'ETIMEDOUT', syscall: 'flock', path: opts.lockFile });
}

/** flock(1)'s exit code when its wait (-w) ran out, as runHere asks it (-E). */
const FLOCK_GAVE_UP = 75;

function runHere(argv: string[], opts: RunOptions): Promise<RunResult> {
  // The lock through flock(1), which holds it until the command ends (-o: the command does not
  // inherit it). Both run in a process group of their own, killed whole at the deadline, so the
  // lock is never let go while the command still runs.
  const locked = opts.lockFile !== undefined;
  // The wait and the run each get the whole time (where the wait ended is not seen from here,
  // the kill comes after both): one killed at a deadline its wait used up would read as hung.
  const wait = opts.timeoutMs ? ['-w', String(opts.timeoutMs / 1000)] : [];
  const started = locked ? ['flock', '-o', '-E', String(FLOCK_GAVE_UP), ...wait, opts.lockFile!, ...argv] : argv;
  const deadline = opts.timeoutMs && (locked ? 2 * opts.timeoutMs : opts.timeoutMs);
  return new Promise((resolve, reject) => {
    const child = spawn(started[0], started.slice(1), {
      env: opts.env ?? process.env,
      stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
      detached: locked,
    });
    const kill = () => {
      try {
        if (locked) process.kill(-child.pid!, 'SIGKILL');
        else child.kill('SIGKILL');
      } catch {
        // ended meanwhile
      }
    };
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => err.push(b));
    let timer: NodeJS.Timeout | undefined;
    if (deadline) timer = setTimeout(kill, deadline);
    child.on('error', (e) => {
      if (timer) clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      if (timer) clearTimeout(timer);
      const res = { exitCode: code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() };
      if (locked && wait.length && code === FLOCK_GAVE_UP && !res.stdout && !res.stderr) return reject(lockTimeout(argv, opts));
      if (code !== 0 && !opts.allowFailure) reject(new CommandError(argv, code, res.stdout, res.stderr));
      else resolve(res);
    });
    if (opts.input !== undefined) {
      // A command that exits before reading all its input: its exit code tells, not an EPIPE.
      child.stdin!.on('error', () => undefined);
      child.stdin!.end(opts.input);
    }
  });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
