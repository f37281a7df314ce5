import os from 'node:os';
import { PassThrough } from 'node:stream';
import type { ContainerSpec, ContainerStatus, ExecOptions, ExecProcess, ExecResult, ExecStreamOptions, RuntimeDriver } from '../drivers';
import { BoxNotRunningError, ExecInputError } from '../errors';
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

  async makeNetns(boxId: string, netnsPath: string): Promise<void> {
    this.fault('makeNetns');
    this.ownNetns.add(`${boxId} ${netnsPath}`);
  }

  async start(spec: ContainerSpec): Promise<void> {
    this.fault('start');
    if (this.containers.get(spec.boxId) === 'running') return;
    this.containers.set(spec.boxId, 'running');
    this.environments.set(spec.boxId, spec.environment);
    this.starts.push(spec);
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
