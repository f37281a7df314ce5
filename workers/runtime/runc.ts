import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { allSettledOrThrow } from '../../core/promises';
import { CommandError, run, sleep } from '../../core/command';
import type { ContainerSpec, ContainerStatus, DriverLogger, ExecOptions, ExecProcess, ExecResult, ExecStreamOptions, IdMap, RuntimeDriver, BoxFiles, BoxServices } from '../drivers';
import type { BoxdClient } from './boxd/client';
import { BoxAgents } from './boxAgents';
import { RuncExec } from './exec';
import { applyResourceParts, BoxLimits, hostAccountsSwap, resourceParts, runcUpdateArgs } from './limits';
import { buildOciSpec, hostNofileHard, validateEnvironment } from './ociSpec';
import { HostPaths } from './reach';
import { ownDir } from '../hostDirs';
import { hasCgroupLeftovers, removeCgroups } from './cgroups';
import { runcLogTail, runDetached } from './runcRun';
import { BoxNamespaces } from './userns';

export { BoxAgentUnavailableError, BoxNotRunningError, ExecInputError } from '../errors';
export { EXEC_OUTPUT_CAP_BYTES } from './exec';

export const RUNC_BIN = '/usr/sbin/runc';
export const TINI_BIN = '/usr/bin/tini-static';
export const BUSYBOX_BIN = '/usr/bin/busybox';
/** boxd as `npm run build` makes it (scripts/build-boxd.sh): dist/boxd/boxd. */
export const BOXD_BIN = path.resolve(__dirname, '..', '..', 'boxd', 'boxd');
/** Where the boxes' boxd sockets are (root only); short, for a unix socket's 108 bytes. */
export const BOXD_SOCKET_DIR = '/run/boxhost/boxd';

export interface RuncRuntimeOptions {
  dataDir: string;
  hostTag: string;
  logger?: DriverLogger;
  runc?: string;
  tini?: string;
  busybox?: string;
  boxd?: string;
  boxdSocketDir?: string;
  /** PID 1 of the boxes this runtime starts: boxd (default), or tini as boxes had before boxd
   *  (exec then goes through `runc exec`; kept so that those boxes keep working until they
   *  restart, and tested that way). */
  init?: 'boxd' | 'tini';
  /** Where the boxes' user namespaces are kept (default USERNS_DIR). */
  usernsDir?: string;
}

const BOX_ID_RE = /^[a-z0-9]{1,32}$/;

/** `/etc/boxes-env`: `KEY=value` lines, values shell-quoted, one per key, sorted. */
export function renderBoxesEnv(environment: Record<string, string>): string {
  validateEnvironment(environment);
  return Object.keys(environment)
    .sort()
    .map((k) => `${k}=${`'${environment[k].replace(/'/g, `'\\''`)}'`}\n`)
    .join('');
}

export class RuncRuntime implements RuntimeDriver {
  readonly dataDir: string;
  readonly hostTag: string;
  /** runc's state directory (`runc --root`). */
  readonly root: string;
  readonly bundlesDir: string;
  private readonly runcBin: string;
  private readonly tini: string;
  private readonly busybox: string;
  private readonly boxd: string;
  private readonly boxdSocketDir: string;
  private readonly init: 'boxd' | 'tini';
  /** Each box's boxd (boxAgents.ts). */
  private readonly boxAgents: BoxAgents;
  private readonly logger?: DriverLogger;
  private readonly execs: RuncExec;
  private readonly namespaces: BoxNamespaces;
  private readonly hostPaths = new HostPaths();
  /** The id map each box was last started with (exec needs it; read from its bundle after a
   *  restart of this process). */
  private readonly idMaps = new Map<string, IdMap | null>();

  constructor(opts: RuncRuntimeOptions) {
    if (!/^[a-z0-9]{1,16}$/.test(opts.hostTag)) throw new Error(`invalid host tag ${opts.hostTag}`);
    this.dataDir = path.resolve(opts.dataDir);
    this.hostTag = opts.hostTag;
    this.root = path.join(this.dataDir, 'runc');
    this.bundlesDir = path.join(this.dataDir, 'bundles');
    this.runcBin = opts.runc ?? RUNC_BIN;
    this.tini = opts.tini ?? TINI_BIN;
    this.busybox = opts.busybox ?? BUSYBOX_BIN;
    this.boxd = opts.boxd ?? BOXD_BIN;
    this.boxdSocketDir = opts.boxdSocketDir ?? BOXD_SOCKET_DIR;
    this.init = opts.init ?? 'boxd';
    this.logger = opts.logger;
    this.namespaces = new BoxNamespaces(this.boxd, opts.usernsDir);
    this.boxAgents = new BoxAgents(this, this.boxdSocketDir);
    this.execs = new RuncExec({
      runcBin: this.runcBin,
      root: this.root,
      execDir: path.join(this.dataDir, 'exec'),
      containerId: (boxId) => this.containerId(boxId),
      bundlePath: (boxId) => this.bundlePath(boxId),
      cgroupsPath: (boxId) => this.cgroupsPath(boxId),
      idMap: (boxId) => this.idMapOf(boxId),
      agent: (boxId) => this.agent(boxId),
      explain: (boxId, e) => this.boxAgents.explain(boxId, e),
    });
  }

  /** The host-side socket of a box's boxd. */
  boxdSocketPath(boxId: string): string {
    return this.boxAgents.socketPath(boxId);
  }

  /** The box's boxd, or null when its PID 1 is not boxd (a box started before boxd). */
  agent(boxId: string): Promise<BoxdClient | null> {
    return this.boxAgents.agent(boxId);
  }

  services(boxId: string): Promise<BoxServices> {
    return this.boxAgents.services(boxId);
  }

  files(boxId: string): Promise<BoxFiles> {
    return this.boxAgents.files(boxId);
  }

  probeAgent(boxId: string, timeoutMs: number): Promise<'ok' | 'none' | 'unresponsive' | 'unknown'> {
    return this.boxAgents.probe(boxId, timeoutMs);
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
    if (current === 'running' || current === 'paused') return void (await spec.rootReady);
    if (current !== null) {
      // created (a start that died half-way) or stopped: make it anew.
      await this.runc(['delete', '--force', cid], { allowFailure: true });
    }
    // Cgroups left by an earlier container of this box would carry its limits over; a box
    // that never ran has none, and looking in each controller costs a few ms.
    if (current !== null || hasCgroupLeftovers(this.cgroupsPath(spec.boxId))) await removeCgroups(this.cgroupsPath(spec.boxId), this.logger, { boxId: spec.boxId });

    const idMap = spec.idMap;
    const bundle = this.bundlePath(spec.boxId);
    // runc takes no symlink for a root: a root's path of old links to its mount behind its range.
    // (One that is not there is runc's to refuse, with its reason.) A root still being made (a
    // create) is waited for here only: the bundle is made meanwhile.
    const rootfs = (async () => {
      // The storage's answer, when it gives one, is the real directory (a realpath through the
      // pool's FUSE mount costs ≈1 ms on a create's path).
      const ready = await spec.rootReady;
      if (typeof ready === 'string' && path.isAbsolute(ready)) return ready;
      return fs.promises.realpath(path.resolve(spec.rootfs)).catch(() => path.resolve(spec.rootfs));
    })();
    const bundleMade = (async () => {
      await Promise.all([
        // The bundle is the host root's, readable by the box's group only (root:<range> 0750),
        // before anything is written in it: the box's user reaches it and nobody else's does, and
        // cannot put anything in it (a symlink in place of a file the node or runc writes would
        // have root write where it points; an earlier version gave the bundle to that user).
        fs.promises.mkdir(bundle, { recursive: true, mode: 0o700 }).then(() => (idMap ? ownDir(bundle, 0, idMap.hostId, 0o750) : undefined)),
        fs.promises.mkdir(this.root, { recursive: true, mode: 0o700 }),
        this.init === 'boxd' ? fs.promises.mkdir(this.boxdSocketDir, { recursive: true, mode: 0o700 }) : null,
      ]);
      // The netns the box joins must be its own user namespace's (BoxSteps makes it beside the
      // root; a caller that did not gets it here).
      if (idMap && !(await this.ownsNetns(spec.boxId, spec.netnsPath))) await this.makeNetns(spec.boxId, spec.netnsPath, idMap);
      // All side by side: every await on a start's path is a round trip through the fs pool.
      await Promise.all([
        writeJsonAtomic(path.join(bundle, 'environment.json'), spec.environment),
        writeFileNoFollow(path.join(bundle, 'hostname'), `${spec.hostname}\n`),
        writeFileNoFollow(path.join(bundle, 'boxes-env'), renderBoxesEnv(spec.environment)),
      ]);
    })();
    const configFor = (root: string) => buildOciSpec({
      rootfs: root,
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
      init: this.init === 'boxd' ? { kind: 'boxd', path: this.boxd } : { kind: 'tini', path: this.tini },
      busyboxPath: this.busybox,
      nofileHard: hostNofileHard(),
      memorySwap: hostAccountsSwap(),
      idMap,
      usernsPath: idMap ? this.namespaces.usernsPath(cid) : undefined,
      annotations: { 'boxhost.box-id': spec.boxId, 'boxhost.host-tag': this.hostTag },
    });
    const configFile = path.join(bundle, 'config.json');
    // The last start's logs go only once the root is there: a start that fails before keeps them
    // (earlier versions gave PID 1 this file for stdio, without bound). A create's root is not
    // there yet: its bundle is written while the root is made, for where the root will be, and
    // the logs go then (a retried create's earlier attempt was reported when it failed).
    const dropLogs = () => Promise.all([fs.promises.rm(path.join(bundle, 'container.log'), { force: true }), fs.promises.rm(path.join(bundle, 'runc.log'), { force: true })]);
    const expected = spec.expectedRootfs;
    const early = expected ? bundleMade.then(() => Promise.all([writeJsonAtomic(configFile, configFor(expected)), dropLogs()])) : Promise.resolve();
    // All settled before a failure is thrown: nothing of this start goes on behind it.
    const [realRoot] = await allSettledOrThrow([rootfs, bundleMade, early] as const);
    await Promise.all([
      realRoot !== expected ? writeJsonAtomic(configFile, configFor(realRoot)) : null,
      expected ? null : dropLogs(),
      // Root in the box (the container init, as it mounts) walks to the bundle's files and the
      // root: the paths down to them are opened for traversal only.
      idMap ? this.hostPaths.makeReachable(this.init === 'boxd' ? [realRoot, bundle, this.boxd] : [realRoot, bundle], idMap.hostId) : null,
    ]);
    this.idMaps.set(spec.boxId, idMap ?? null);
    this.boxAgents.started(spec.boxId, this.init === 'boxd');

    const t0 = Date.now();
    const listen = this.init === 'boxd' ? { boxd: this.boxd, socket: this.boxdSocketPath(spec.boxId) } : undefined;
    const code = await runDetached(this.runcBin, this.root, bundle, cid, listen);
    if (code !== 0) {
      const again = await this.status(spec.boxId);
      if (again === 'running') return; // a concurrent start won
      throw new CommandError([this.runcBin, 'run', '--detach', cid], code, '', await runcLogTail(bundle));
    }
    this.logger?.debug({ boxId: spec.boxId, ms: Date.now() - t0 }, 'runc run');
  }

  ownsNetns(boxId: string, netnsPath: string): Promise<boolean> {
    return this.namespaces.owns(this.containerId(boxId), netnsPath);
  }

  netnsLoopbackUp(boxId: string, netnsPath: string): Promise<boolean> {
    return this.namespaces.loopbackUp(this.containerId(boxId), netnsPath);
  }

  async makeNetns(boxId: string, netnsPath: string, idMap: IdMap): Promise<void> {
    const t0 = Date.now();
    await this.namespaces.make(this.containerId(boxId), netnsPath, idMap);
    this.logger?.debug({ boxId, ms: Date.now() - t0 }, 'user and network namespaces made');
  }

  /** The id map a box's container was started with (null: none). */
  private async idMapOf(boxId: string): Promise<IdMap | null> {
    const known = this.idMaps.get(boxId);
    if (known !== undefined) return known;
    let found: IdMap | null = null;
    try {
      const config = JSON.parse(await fs.promises.readFile(path.join(this.bundlePath(boxId), 'config.json'), 'utf8'));
      const m = config.linux?.uidMappings?.[0];
      if (m) found = { hostId: m.hostID, size: m.size };
    } catch {
      /* no bundle: no container either */
    }
    this.idMaps.set(boxId, found);
    return found;
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
      // boxd ignores signals (a box process could send them too): it is asked over its socket
      // to TERM everything in the box and exit. tini gets SIGTERM.
      const agent = await this.agent(boxId);
      if (agent) {
        // Not awaited: a boxd that does not answer must not add its answer timeout to the grace.
        void agent.shutdown(Math.max(0, graceSeconds) * 1000).catch((e) => this.logger?.warn({ boxId, err: String(e) }, 'boxd did not take the shutdown: the box is killed after its grace'));
      } else {
        await this.runc(['kill', cid, 'TERM'], { allowFailure: true });
      }
      st = await this.waitStopped(boxId, Math.max(0, graceSeconds) * 1000 + (agent ? 500 : 0));
      if (st !== 'stopped' && st !== null) {
        // PID 1 killed takes the box's pid namespace with it, stopped processes too; every
        // process of its cgroup is killed as well, in case PID 1 itself cannot die at once.
        await this.runc(['kill', cid, 'KILL'], { allowFailure: true });
        st = await this.waitStopped(boxId, 1000);
        if (st !== 'stopped' && st !== null) {
          await this.runc(['kill', '--all', cid, 'KILL'], { allowFailure: true });
          st = await this.waitStopped(boxId, 10_000);
        }
      }
    }
    if (st !== null) {
      const res = await this.runc(['delete', '--force', cid], { allowFailure: true });
      if (res.exitCode !== 0 && (await this.status(boxId)) !== null) {
        throw new CommandError([this.runcBin, 'delete', '--force', cid], res.exitCode, res.stdout, res.stderr);
      }
    }
    await removeCgroups(this.cgroupsPath(boxId), this.logger, { boxId });
    await fs.promises.rm(this.boxdSocketPath(boxId), { force: true });
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
    await removeCgroups(this.cgroupsPath(boxId), this.logger, { boxId });
    await this.namespaces.release(cid);
    this.idMaps.delete(boxId);
    this.boxAgents.removed(boxId);
    await fs.promises.rm(this.boxdSocketPath(boxId), { force: true });
    await fs.promises.rm(this.bundlePath(boxId), { recursive: true, force: true });
  }

  async pause(boxId: string): Promise<void> {
    if ((await this.status(boxId)) !== 'running') return;
    await this.runc(['pause', this.containerId(boxId)]);
  }

  async unpause(boxId: string): Promise<void> {
    if ((await this.status(boxId)) !== 'paused') return;
    await this.runc(['resume', this.containerId(boxId)]);
  }

  /** `runc update` with the same numbers a start would put in the spec (limits.ts). */
  async update(boxId: string, limits: BoxLimits): Promise<void> {
    const cid = this.containerId(boxId);
    const parts = resourceParts(limits, hostAccountsSwap());
    const args = runcUpdateArgs(parts);
    if (args.length === 0) return;
    await this.runc(['update', ...args, cid]);
    // Keep the bundle in step, so that a later look at config.json tells the truth.
    try {
      const file = path.join(this.bundlePath(boxId), 'config.json');
      const config = JSON.parse(await fs.promises.readFile(file, 'utf8'));
      applyResourceParts((config.linux.resources ??= {}), parts);
      await writeJsonAtomic(file, config);
    } catch {
      /* the bundle is rewritten at the next start anyway */
    }
  }

  tidy(): Promise<void> {
    return this.namespaces.sweep();
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
    await writeFileNoFollow(path.join(bundle, 'boxes-env'), renderBoxesEnv(environment));
  }

  // ---------------------------------------------------------------- exec

  exec(boxId: string, opts: ExecOptions): Promise<ExecResult> {
    return this.execs.exec(boxId, opts);
  }

  execStream(boxId: string, opts: ExecStreamOptions): Promise<ExecProcess> {
    return this.execs.stream(boxId, opts);
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

/**
 * Writes `file` in place (0644, root's), never through what a box user may have left there in
 * an earlier version's bundle (theirs then): a symlink, a FIFO (a write to it would wait for
 * ever), a hard link; such an entry is removed and the file made anew.
 */
async function writeFileNoFollow(file: string, data: string): Promise<void> {
  const flags = fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK;
  let fh: fs.promises.FileHandle | null = await fs.promises.open(file, flags, 0o644).catch((e: NodeJS.ErrnoException) => {
    if (e.code === 'ELOOP' || e.code === 'ENXIO') return null; // a symlink; a FIFO nobody reads
    throw e;
  });
  if (fh) {
    const st = await fh.stat();
    if (!st.isFile() || st.nlink !== 1) {
      await fh.close();
      fh = null;
    }
  }
  if (!fh) {
    await fs.promises.unlink(file);
    fh = await fs.promises.open(file, flags | fs.constants.O_EXCL, 0o644);
  }
  try {
    await fh.truncate(0);
    await fh.chown(0, 0);
    await fh.chmod(0o644);
    await fh.writeFile(data);
  } finally {
    await fh.close();
  }
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.${crypto.randomBytes(4).toString('hex')}.tmp`;
  await fs.promises.writeFile(tmp, JSON.stringify(value, null, 1), { mode: 0o600 });
  await fs.promises.rename(tmp, file);
}
