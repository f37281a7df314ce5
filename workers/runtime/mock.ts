import os from 'node:os';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import type { BoxFileInfo, BoxFiles, BoxServices, BoxServiceState, ContainerSpec, ContainerStatus, ExecOptions, ExecProcess, ExecResult, ExecStreamOptions, RuntimeDriver } from '../drivers';
import { BoxFileError, BoxNotRunningError, BoxServiceError, ExecInputError } from '../errors';
import { WithFaults } from '../mockFaults';

type Method = keyof RuntimeDriver;

/** What a mock exec is asked to run: the environment is the box's merged with the call's, and
 *  stdin is what the caller sent (all of it, up to EOF, for a stream). */
export interface MockExecCall {
  command: string[];
  cwd?: string;
  env: Record<string, string>;
  user?: string;
  stdin?: Buffer;
}

export interface MockExecOutput {
  exitCode: number;
  stdout: string;
  stderr?: string;
}

export type MockExecHandler = (boxId: string, call: MockExecCall) => MockExecOutput | Promise<MockExecOutput>;

/** Without a handler a command "prints itself": enough to see what was run. */
const echo: MockExecHandler = (_boxId, call) => ({ exitCode: 0, stdout: `${call.command.join(' ')}\n` });

/**
 * RuntimeDriver in memory, for tests that need no root and no runc. A container is its status;
 * like runc's, a stopped container is deleted (`stop` ends with `runc delete`).
 * Records every start that made a container and every limit change, so tests can see which
 * config a box was started with.
 */
export class MockRuntime extends WithFaults<Method> implements RuntimeDriver {
  /** The answer of `exec` and `execStream`; replace it to script what commands print. */
  execHandler: MockExecHandler = echo;
  /** Specs of the starts that made a container, oldest first. */
  readonly starts: ContainerSpec[] = [];
  /** Limits applied with `update`, oldest first. */
  readonly updates: { boxId: string; limits: { cpus?: number; ramMb?: number } }[] = [];
  private readonly containers = new Map<string, ContainerStatus>();
  private readonly environments = new Map<string, Record<string, string>>();
  private nextPid = 1000;


  /** Netns the mock made "in a user namespace" (as the real runtime's makeNetns does). */
  private readonly ownNetns = new Set<string>();

  async tidy(): Promise<void> {
    this.fault('tidy');
  }

  async ownsNetns(boxId: string, netnsPath: string): Promise<boolean> {
    this.fault('ownsNetns');
    return this.ownNetns.has(`${boxId} ${netnsPath}`);
  }

  async netnsLoopbackUp(boxId: string, netnsPath: string): Promise<boolean> {
    this.fault('netnsLoopbackUp');
    return this.ownNetns.has(`${boxId} ${netnsPath}`);
  }

  async makeNetns(boxId: string, netnsPath: string): Promise<void> {
    this.fault('makeNetns');
    this.ownNetns.add(`${boxId} ${netnsPath}`);
  }

  async start(spec: ContainerSpec): Promise<void> {
    await spec.rootReady;
    this.fault('start');
    if (this.containers.get(spec.boxId) === 'running') return;
    this.containers.set(spec.boxId, 'running');
    this.environments.set(spec.boxId, spec.environment);
    const { rootReady: _ready, ...started } = spec;
    this.starts.push(started);
  }

  async status(boxId: string): Promise<ContainerStatus | null> {
    this.fault('status');
    return this.containers.get(boxId) ?? null;
  }

  async stop(boxId: string, _graceSeconds: number): Promise<void> {
    this.fault('stop');
    this.containers.delete(boxId);
  }

  async remove(boxId: string): Promise<void> {
    this.fault('remove');
    this.containers.delete(boxId);
    this.environments.delete(boxId);
    this.boxServices.delete(boxId);
  }

  private readonly boxServices = new Map<string, Map<string, BoxServiceState>>();

  /**
   * Services in memory per box: a start runs at once (pid 100 + n), a stop stops. A mock service
   * "listens" on the `port` of its spec, so a probe of that port passes and any other fails.
   */
  async services(boxId: string): Promise<BoxServices> {
    this.fault('services');
    if (this.containers.get(boxId) !== 'running') throw new BoxNotRunningError(`box ${boxId} is not running`);
    let all = this.boxServices.get(boxId);
    if (!all) this.boxServices.set(boxId, (all = new Map()));
    const svcs = all;
    const one = (name: string) => {
      const s = svcs.get(name);
      if (!s) throw new BoxServiceError('not_found', `no service "${name}" in the box`, 'name');
      return s;
    };
    const set = (name: string, state: BoxServiceState['state']) => {
      const s = one(name);
      s.state = state;
      s.pid = state === 'running' ? 100 + svcs.size : 0;
      return { ...s };
    };
    return {
      start: async (spec) => {
        if (!spec.command.length) throw new BoxServiceError('input', 'command must not be empty', 'command');
        const replaced = svcs.has(spec.name);
        svcs.set(spec.name, { name: spec.name, state: 'running', pid: 100 + svcs.size, restarts: 0, lastExitCode: null, spec: { ...spec } });
        return { service: { ...one(spec.name) }, replaced };
      },
      resume: async (name) => set(name, 'running'),
      restart: async (name) => set(name, 'running'),
      stop: async (name, opts) => set(name, opts?.fail ? 'failed' : 'stopped'),
      get: async (name) => ({ ...one(name) }),
      list: async () => [...svcs.values()].map((s) => ({ ...s })).sort((a, b) => a.name.localeCompare(b.name)),
      remove: async (name) => void (one(name), svcs.delete(name)),
      logs: async (name) => (one(name), Readable.from([Buffer.from(`${name} started\n`)])),
      probe: async (p) => ([...svcs.values()].some((s) => s.state === 'running' && s.spec?.port === p.port) ? { ok: true } : { ok: false, issue: `nothing accepts connections on port ${p.port}` }),
    };
  }

  private readonly boxFiles = new Map<string, Map<string, { data: Buffer; mode: number; mtime: string }>>();

  /** Files in memory per box: regular files only, directories implied by their paths. */
  async files(boxId: string): Promise<BoxFiles> {
    this.fault('files');
    if (this.containers.get(boxId) !== 'running') throw new BoxNotRunningError(`box ${boxId} is not running`);
    let fsOf = this.boxFiles.get(boxId);
    if (!fsOf) this.boxFiles.set(boxId, (fsOf = new Map()));
    const files = fsOf;
    const norm = (p: string) => {
      if (!p.startsWith('/')) throw new BoxFileError('input', 'path must be absolute');
      return path.posix.normalize(p).replace(/(.)\/$/, '$1');
    };
    const isDir = (p: string) => p === '/' || [...files.keys()].some((k) => k.startsWith(`${p}/`));
    const info = (p: string): BoxFileInfo => {
      const f = files.get(p);
      if (f) return { name: path.posix.basename(p), type: 'file', size: f.data.length, mode: f.mode, mtime: f.mtime, uid: 0, gid: 0 };
      if (isDir(p)) return { name: path.posix.basename(p) || '/', type: 'dir', size: 0, mode: 0o755, mtime: new Date(0).toISOString(), uid: 0, gid: 0 };
      throw new BoxFileError('not_found', `${p}: no such file or directory`);
    };
    return {
      stat: async (p) => info(norm(p)),
      list: async (p) => {
        const dir = norm(p);
        if (info(dir).type !== 'dir') throw new BoxFileError('invalid', `${dir}: not a directory`);
        const prefix = dir === '/' ? '/' : `${dir}/`;
        const names = [...new Set([...files.keys()].filter((k) => k.startsWith(prefix)).map((k) => k.slice(prefix.length).split('/')[0]))].sort();
        return { entries: names.map((n) => info(prefix + n)), truncated: false };
      },
      read: async (p) => {
        const i = info(norm(p));
        if (i.type !== 'file') throw new BoxFileError('invalid', `${p}: is a directory`);
        return { info: i, data: Readable.from([files.get(norm(p))!.data]) };
      },
      write: async (p, data, opts) => {
        const target = norm(p);
        if (isDir(target)) throw new BoxFileError('invalid', `${target}: is a directory`);
        const chunks: Buffer[] = [];
        for await (const c of data) chunks.push(Buffer.isBuffer(c) ? c : Buffer.from(c));
        files.set(target, { data: Buffer.concat(chunks), mode: opts.mode ?? 0o644, mtime: new Date().toISOString() });
        return info(target);
      },
      remove: async (p, opts) => {
        const target = norm(p);
        const i = info(target);
        if (i.type === 'dir' && !opts.recursive) throw new BoxFileError('invalid', `${target}: directory not empty`);
        for (const k of [...files.keys()]) if (k === target || k.startsWith(`${target}/`)) files.delete(k);
      },
    };
  }

  /** Boxes whose agent is made to not answer (tests of the agent watchdog). */
  readonly wedgedAgents = new Set<string>();

  async probeAgent(boxId: string, _timeoutMs: number): Promise<'ok' | 'none' | 'unresponsive' | 'unknown'> {
    this.fault('probeAgent');
    if (this.containers.get(boxId) !== 'running') return 'none';
    return this.wedgedAgents.has(boxId) ? 'unresponsive' : 'ok';
  }

  async pause(boxId: string): Promise<void> {
    this.fault('pause');
    if (this.containers.get(boxId) === 'running') this.containers.set(boxId, 'paused');
  }

  async unpause(boxId: string): Promise<void> {
    this.fault('unpause');
    if (this.containers.get(boxId) === 'paused') this.containers.set(boxId, 'running');
  }

  async update(boxId: string, limits: { cpus?: number; ramMb?: number }): Promise<void> {
    this.fault('update');
    if (this.containers.get(boxId) !== 'running') throw new BoxNotRunningError(`container of box ${boxId} is not running`);
    this.updates.push({ boxId, limits });
  }

  async exec(boxId: string, opts: ExecOptions): Promise<ExecResult> {
    this.fault('exec');
    checkCommand(opts.command);
    if (this.containers.get(boxId) !== 'running') throw new BoxNotRunningError(`box ${boxId} is not running`);
    const pid = this.nextPid++;
    if (opts.detach) return { exitCode: -1, stdout: '', stderr: '', pid, detached: true, truncated: false };
    const out = await this.execHandler(boxId, this.call(boxId, opts, opts.stdin));
    const stderr = out.stderr ?? '';
    return { exitCode: out.exitCode, stdout: opts.tty ? out.stdout + stderr : out.stdout, stderr: opts.tty ? '' : stderr, pid, detached: false, truncated: false };
  }

  /**
   * The handler's output flows through PassThrough streams that end before `exited` settles.
   * A box that is not running is found out as runc would find it: `exited` rejects.
   */
  async execStream(boxId: string, opts: ExecStreamOptions): Promise<ExecProcess> {
    this.fault('execStream');
    checkCommand(opts.command);
    const running = this.containers.get(boxId) === 'running';
    const pid = running ? this.nextPid++ : 0;
    const stdin = opts.stdin ? new PassThrough() : null;
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let settled = false;
    let settle!: (outcome: { exitCode: number; timedOut: boolean } | Error) => void;
    const exited = new Promise<{ exitCode: number; timedOut: boolean }>((resolve, reject) => {
      settle = (outcome) => {
        if (settled) return;
        settled = true;
        stdout.end();
        stderr.end();
        stdin?.destroy();
        if (outcome instanceof Error) reject(outcome);
        else resolve(outcome);
      };
    });
    // Marks the rejection handled: a caller that never awaits `exited` must not crash the test.
    exited.catch(() => undefined);

    if (!running) settle(new BoxNotRunningError(`box ${boxId} is not running`));
    else {
      void (async () => {
        const input = stdin ? await readAll(stdin) : undefined;
        const out = await this.execHandler(boxId, this.call(boxId, opts, input));
        if (settled) return;
        if (out.stdout) stdout.write(out.stdout);
        if (out.stderr) (opts.tty ? stdout : stderr).write(out.stderr);
        settle({ exitCode: out.exitCode, timedOut: false });
      })().catch((e: Error) => settle(e));
    }

    return {
      stdin,
      stdout,
      stderr,
      pid: async () => pid,
      resize: async () => undefined,
      signal: (sig) => settle({ exitCode: 128 + os.constants.signals[sig], timedOut: false }),
      exited,
    };
  }

  async list(): Promise<{ boxId: string; status: ContainerStatus }[]> {
    this.fault('list');
    return [...this.containers].map(([boxId, status]) => ({ boxId, status }));
  }

  async writeEnvironment(boxId: string, environment: Record<string, string>): Promise<void> {
    this.fault('writeEnvironment');
    this.environments.set(boxId, environment);
  }

  private call(boxId: string, opts: ExecStreamOptions | ExecOptions, stdin: Buffer | undefined): MockExecCall {
    return { command: opts.command, cwd: opts.cwd, env: { ...this.environments.get(boxId), ...opts.env }, user: opts.user, stdin };
  }
}

function checkCommand(command: string[]): void {
  if (!Array.isArray(command) || command.length === 0 || command[0] === '') throw new ExecInputError('command must not be empty');
}

async function readAll(stream: PassThrough): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}
