/**
 * The raw-tool floor: the same work done with the bare CLIs, no API, no queue, no database.
 *
 * - create: `zfs clone <base>@base <root>/bench-raw-N` + config.json + `runc run -d` (timed
 *   together), with the boxes' own config: a user namespace with the project's mapping (runc
 *   makes it, and the netns inside it) on a clone of the base's copy shifted into that range
 * - exec:   `runc --root <dataDir>/runc exec <container> true`
 *
 * Everything here is spawned directly (not through core/command's `run`, which the bench probes),
 * so the host's own command accounting never includes the raw runs.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { projectIdMap, type IdMap } from '../core/box';
import type { Db } from '../db/knex';
import { projectsRepo } from '../db/repos/projects';
import { busyboxVersion } from '../workers/bases/busyboxRootfs';
import { buildOciSpec, hostNofileHard } from '../workers/runtime/ociSpec';
import { BUSYBOX_BIN, RUNC_BIN, TINI_BIN } from '../workers/runtime/runc';
import { BASE_SNAPSHOT, IDMAP_PROP } from '../workers/storage/zfsCommon';
import { machineMountLock } from '../workers/storage/zfsFuse';
import { runcLogTail, runDetached } from '../workers/runtime/runcRun';
import { nowMs } from './stats';

const ZFS_BIN = fs.existsSync('/usr/sbin/zfs') ? '/usr/sbin/zfs' : 'zfs';

export interface ProcResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Spawns a command with stdout/stderr as pipes and waits for them to close. */
export function spawnCollect(argv: string[], opts: { cwd?: string } = {}): Promise<ProcResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), { cwd: opts.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => err.push(b));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }));
  });
}

async function must(argv: string[]): Promise<ProcResult> {
  const r = await spawnCollect(argv);
  if (r.code !== 0) throw new Error(`${argv.join(' ')} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`);
  return r;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * The busybox base a project's boxes are cloned from, as the raw floor clones it: its version,
 * the project's id range, the base's copy in that range (made by the project's first box) and
 * the base itself.
 */
export async function busyboxFloorBase(db: Db, zfsRoot: string, project: string): Promise<{ idMap: IdMap; shiftedSnapshot: string; plainSnapshot: string }> {
  const idMap = projectIdMap((await projectsRepo.get(db, project))!.net_index);
  const version = await busyboxVersion();
  return {
    idMap,
    shiftedSnapshot: `${zfsRoot}/shifted/busybox/${version}/${idMap.hostId}@${BASE_SNAPSHOT}`,
    plainSnapshot: `${zfsRoot}/bases/busybox/${version}@${BASE_SNAPSHOT}`,
  };
}

/** The storage work a box's root gets beyond the clone (RawRunnerOptions.sameStorageWork). */
export const boxStorageWork = (storageGb: number) => ({ storageGb, idProperty: IDMAP_PROP });

export interface RawCreateSample {
  cloneMs: number;
  /** Writing config.json into the bundle. */
  bundleMs: number;
  runMs: number;
  totalMs: number;
}

export interface RawRunnerOptions {
  dataDir: string;
  hostTag: string;
  /** The ZFS dataset that holds bases/ and boxes/ (the pool itself for the loop-file pool). */
  zfsRoot: string;
  /** The snapshot the API's boxes are cloned from: the busybox base's copy in `idMap`'s range. */
  baseSnapshot: string;
  /** The user namespace mapping of the bench project's boxes (none: no user namespace). */
  idMap?: IdMap;
  /** Names this runner's datasets, containers and directories (`raw`). */
  name?: string;
  /** Do the storage work a box's root gets: the clone's properties (quota, refquota, id range)
   *  and the nosuid,nodev remount zfs-fuse needs. */
  sameStorageWork?: { storageGb: number; idProperty: string };
}

export class RawRunner {
  readonly runcRoot: string;
  private readonly bundlesDir: string;
  private readonly clones: string[] = [];
  private readonly containers: { id: string; cgroupsPath: string }[] = [];
  private template?: Record<string, any>;
  private mountRoot = '';
  private readonly name: string;

  constructor(private readonly opts: RawRunnerOptions) {
    this.name = opts.name ?? 'raw';
    this.runcRoot = path.join(opts.dataDir, `bench-${this.name}`, 'runc');
    this.bundlesDir = path.join(opts.dataDir, `bench-${this.name}`, 'bundles');
  }

  /** The OCI config every raw container gets: the repo's own builder (same mounts, seccomp,
   *  capabilities as a box), with a fresh network namespace instead of a CNI one. */
  async prepare(): Promise<void> {
    fs.mkdirSync(this.runcRoot, { recursive: true, mode: 0o700 });
    fs.mkdirSync(this.bundlesDir, { recursive: true, mode: 0o700 });
    const spec = buildOciSpec({
      rootfs: '/nonexistent',
      hostname: 'bench-raw',
      netnsPath: '/nonexistent',
      cgroupsPath: '/nonexistent',
      cpus: 1,
      ramMb: 512,
      environment: {},
      mounts: [],
      init: { kind: 'tini', path: TINI_BIN },
      busyboxPath: BUSYBOX_BIN,
      nofileHard: hostNofileHard(),
      idMap: this.opts.idMap,
    }) as Record<string, any>;
    spec.process.terminal = false;
    spec.linux.namespaces = (spec.linux.namespaces as { type: string; path?: string }[]).map((ns) => (ns.type === 'network' ? { type: 'network' } : ns));
    this.template = spec;
    this.mountRoot = (await must([ZFS_BIN, 'get', '-H', '-o', 'value', 'mountpoint', this.opts.zfsRoot])).stdout.trim();
    if (!path.isAbsolute(this.mountRoot)) throw new Error(`${this.opts.zfsRoot} has mountpoint ${this.mountRoot}`);
  }

  /** clone + bundle + `runc run -d`, timed together. */
  async createAndRun(n: number): Promise<RawCreateSample> {
    if (!this.template) throw new Error('prepare() first');
    const ds = `${this.opts.zfsRoot}/bench-${this.name}-${n}`;
    const rootfs = path.join(this.mountRoot, `bench-${this.name}-${n}`);
    const id = `bhbench${this.opts.hostTag}${this.name}-${n}`;
    const cgroupsPath = `/${id}`;
    const bundle = path.join(this.bundlesDir, id);
    fs.mkdirSync(bundle, { recursive: true, mode: 0o700 });

    const t0 = nowMs();
    const work = this.opts.sameStorageWork;
    const props = work ? ['-o', `refquota=${work.storageGb}G`, '-o', `quota=${work.storageGb}G`, '-o', `${work.idProperty}=${this.opts.idMap?.hostId ?? 0}`] : [];
    // A clone mounts: on zfs-fuse it takes the machine's mount lock as the storage driver's do
    // (two mounts at once can wedge the daemon: docs/decisions.md "Storage watchdog").
    const lock = machineMountLock();
    const clone = await spawnCollect([...(lock ? ['flock', '-o', lock] : []), ZFS_BIN, 'clone', ...props, this.opts.baseSnapshot, ds]);
    // Recorded before anything else can fail, so that cleanup() removes it.
    if (clone.code === 0) this.clones.push(ds);
    if (clone.code === 0 && work) await must(['mount', '-o', 'remount,bind,nosuid,nodev', rootfs]);
    const t1 = nowMs();
    if (clone.code !== 0) throw new Error(`zfs clone ${ds} failed: ${clone.stderr.trim()}`);
    const config = { ...this.template, root: { path: rootfs, readonly: false }, linux: { ...this.template.linux, cgroupsPath } };
    await fs.promises.writeFile(path.join(bundle, 'config.json'), JSON.stringify(config));
    const t2 = nowMs();
    // The same detached start the runtime driver makes (stdio to a file, never pipes).
    const code = await runDetached(RUNC_BIN, this.runcRoot, bundle, id);
    const t3 = nowMs();
    this.containers.push({ id, cgroupsPath });
    if (code !== 0) throw new Error(`runc run -d ${id} exited ${code}: ${(await runcLogTail(bundle)).trim()}`);
    // Outside the timing: the container really runs on the clone (not on an unmounted, empty dir).
    if (!fs.existsSync(path.join(rootfs, 'bin', 'busybox'))) throw new Error(`raw clone ${ds} is not mounted at ${rootfs}`);
    if (this.opts.idMap && fs.statSync(rootfs).uid !== this.opts.idMap.hostId) throw new Error(`raw clone ${ds} is not in the id range from ${this.opts.idMap.hostId}`);
    const state = JSON.parse((await must([RUNC_BIN, '--root', this.runcRoot, 'state', id])).stdout) as { status: string };
    if (state.status !== 'running') throw new Error(`raw container ${id} is ${state.status}`);
    return { cloneMs: t1 - t0, bundleMs: t2 - t1, runMs: t3 - t2, totalMs: t3 - t0 };
  }

  /** `runc exec <id> true` against an existing container (e.g. a box's), timed. */
  async exec(runcRoot: string, containerId: string): Promise<number> {
    const t0 = nowMs();
    const r = await spawnCollect([RUNC_BIN, '--root', runcRoot, 'exec', containerId, 'true']);
    const ms = nowMs() - t0;
    if (r.code !== 0) throw new Error(`runc exec ${containerId} true exited ${r.code}: ${r.stderr.trim()}`);
    return ms;
  }

  /** Removes every raw container, its cgroups, bundle and clone. Errors are collected, not thrown
   *  half-way: everything gets a try. */
  async cleanup(): Promise<string[]> {
    const problems: string[] = [];
    for (const c of this.containers.splice(0)) {
      const r = await spawnCollect([RUNC_BIN, '--root', this.runcRoot, 'delete', '--force', c.id]);
      if (r.code !== 0 && !/does not exist|not exist/i.test(r.stderr)) problems.push(`runc delete ${c.id}: ${r.stderr.trim()}`);
      await removeCgroups(c.cgroupsPath).catch((e) => problems.push(`cgroups of ${c.id}: ${String(e)}`));
    }
    for (const ds of this.clones.splice(0)) {
      const err = await destroyDataset(ds);
      if (err) problems.push(err);
    }
    fs.rmSync(path.dirname(this.runcRoot), { recursive: true, force: true });
    return problems;
  }
}

/** zfs-fuse answers "dataset is busy" right after use: unmount first and retry a few times. */
async function destroyDataset(ds: string): Promise<string | null> {
  let last = '';
  for (let i = 0; i < 12; i++) {
    await spawnCollect([ZFS_BIN, 'umount', ...(i >= 6 ? ['-f'] : []), ds]);
    const r = await spawnCollect([ZFS_BIN, 'destroy', '-r', ds]);
    if (r.code === 0 || /does not exist/i.test(r.stderr)) return null;
    last = r.stderr.trim();
    if (!/busy/i.test(last)) break;
    await sleep(Math.min(25 * 2 ** i, 1000));
  }
  return `zfs destroy ${ds}: ${last}`;
}

/** rmdir the (empty) cgroup directories runc leaves behind, deepest first. */
async function removeCgroups(cgroupsPath: string): Promise<void> {
  let controllers: string[];
  try {
    controllers = await fs.promises.readdir('/sys/fs/cgroup');
  } catch {
    return;
  }
  for (const c of controllers) await rmdirTree(path.join('/sys/fs/cgroup', c, cgroupsPath.slice(1)));
}

async function rmdirTree(dir: string): Promise<void> {
  let entries: fs.Dirent[];
  try {
    entries = await fs.promises.readdir(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) if (e.isDirectory()) await rmdirTree(path.join(dir, e.name));
  await fs.promises.rmdir(dir).catch(() => undefined);
}
