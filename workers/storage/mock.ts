import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { BaseRef, BoxSnapshotInfo, IdMap, RootSource, StorageDriver, StorageProbe } from '../drivers';
import { StorageInUseError } from './errors';
import { WithFaults } from '../mockFaults';

/** A box root as the mock keeps it: no files, only where it came from and its quota. */
export interface MockBoxRoot {
  /** Its origin. Like `zfs promote`, destroying the source box hands the source's own origin
   *  down, so a fork always names something that exists. */
  source: RootSource;
  /** The base its data descends from, whatever the chain of forks in between. */
  base: BaseRef;
  /** The quota it was made with. */
  storageGb?: number;
  /** The id range its files were shifted into (a fork inherits its source's). */
  idMap?: IdMap;
  /** User snapshots (name → creation time, description), in creation order. */
  snapshots: Map<string, { createdAt: string; description?: string }>;
}

type Method = keyof StorageDriver;

const baseKey = (b: BaseRef) => `${b.name}@${b.version}`;

/**
 * StorageDriver in memory, for tests that need no root and no ZFS (as LXD's mock storage
 * driver). Keeps the promises of the ZFS driver that callers rely on: idempotent creates and
 * destroys, refquota per root, forks that outlive their source, bases that refuse to go while
 * roots depend on them.
 */
export class MockStorage extends WithFaults<Method> implements StorageDriver {
  /** Set to make `health()` throw with this message (a pool that went away). */
  failHealth?: string;
  private readonly bases = new Map<string, { base: BaseRef; sizeBytes: number }>();
  private readonly roots = new Map<string, MockBoxRoot>();
  /** `box@snapshot` of every rollback, in order (what a test asserts on). */
  readonly rollbacks: string[] = [];

  constructor(private readonly opts: { capacityGb?: number; mountRoot?: string; rootLimit?: number } = {}) {
    super();
  }


  /** What the mock holds for a box root (for assertions). */
  root(boxId: string): Readonly<MockBoxRoot> | undefined {
    return this.roots.get(boxId);
  }

  async init(): Promise<void> {
    this.fault('init');
  }

  async health(): Promise<void> {
    this.fault('health');
    if (this.failHealth !== undefined) throw new Error(this.failHealth);
  }

  /** What `probe` answers until `restart` (a storage that died or hung: `dead`, `hung`). */
  probeState: StorageProbe['state'] = 'ok';
  restartable = true;
  /** How many times `restart` ran. */
  restarts = 0;

  /** For `hung`: what did not answer (StorageProbe.scope). */
  probeScope: StorageProbe['scope'] = 'daemon';

  async probe(): Promise<StorageProbe> {
    return { state: this.probeState, scope: this.probeState === 'hung' ? this.probeScope : undefined, detail: `mock storage ${this.probeState}` };
  }

  async restart(): Promise<void> {
    this.fault('restart');
    this.restarts++;
    this.probeState = 'ok';
  }

  async capacityBytes(): Promise<number> {
    this.fault('capacityBytes');
    return (this.opts.capacityGb ?? 20) * 1024 ** 3;
  }

  /** `rootLimit` option: a node that can hold that many roots (default: no limit). */
  async rootLimit(): Promise<number | null> {
    return this.opts.rootLimit ?? null;
  }

  async hasBase(base: BaseRef): Promise<boolean> {
    this.fault('hasBase');
    return this.bases.has(baseKey(base));
  }

  /** `fill` writes into a scratch directory (its files are not kept, only their size): a fill
   *  that fails leaves no base, as on ZFS. */
  async createBase(base: BaseRef, fill: (dir: string) => Promise<void>): Promise<void> {
    this.fault('createBase');
    if (this.bases.has(baseKey(base))) return;
    const dir = await fs.promises.mkdtemp(path.join(os.tmpdir(), 'boxhost-mock-base-'));
    try {
      await fill(dir);
      this.bases.set(baseKey(base), { base, sizeBytes: await sizeOf(dir) });
    } finally {
      await fs.promises.rm(dir, { recursive: true, force: true });
    }
  }

  async destroyBase(base: BaseRef): Promise<void> {
    this.fault('destroyBase');
    const key = baseKey(base);
    const dependents = [...this.roots].filter(([, r]) => baseKey(r.base) === key).map(([id]) => id);
    if (dependents.length > 0) {
      throw new StorageInUseError(`base ${key} is in use by ${dependents.length} box root(s): ${dependents.join(', ')}`, dependents);
    }
    this.bases.delete(key);
  }

  async baseSizeBytes(base: BaseRef): Promise<number> {
    this.fault('baseSizeBytes');
    const b = this.bases.get(baseKey(base));
    if (!b) throw new Error(`base ${baseKey(base)} does not exist`);
    return b.sizeBytes;
  }

  baseRootPath(base: BaseRef): string {
    return path.join(this.opts.mountRoot ?? '/nonexistent/boxhost-mock', 'bases', base.name, base.version);
  }

  /** Holds as `box@tag` (no files: the base made from it is empty, its lineage kept). */
  private readonly holds = new Set<string>();

  async holdBoxRoot(boxId: string, tag: string): Promise<void> {
    this.fault('holdBoxRoot');
    if (!this.roots.has(boxId)) throw new Error(`box root ${boxId} does not exist`);
    this.holds.add(`${boxId}@${tag}`);
  }

  async baseFromBoxRoot(boxId: string, tag: string, base: BaseRef): Promise<void> {
    this.fault('baseFromBoxRoot');
    if (!this.bases.has(baseKey(base))) {
      if (!this.holds.has(`${boxId}@${tag}`)) throw new Error(`box root ${boxId} has no hold ${tag}`);
      await this.createBase(base, async () => {});
    }
    this.holds.delete(`${boxId}@${tag}`);
  }

  async releaseBoxRoot(boxId: string, tag: string): Promise<void> {
    this.holds.delete(`${boxId}@${tag}`);
  }

  /** Holds not yet dropped (for assertions). */
  get heldRoots(): string[] {
    return [...this.holds];
  }

  async createBoxRoot(boxId: string, source: RootSource, storageGb?: number, idMap?: IdMap): Promise<string> {
    this.fault('createBoxRoot');
    if (storageGb !== undefined && !(Number.isFinite(storageGb) && storageGb > 0)) throw new Error(`invalid storage size ${storageGb} GB`);
    if (this.roots.has(boxId)) return this.boxRootPath(boxId);
    let base: BaseRef;
    let ids = idMap;
    if (source.kind === 'base') {
      if (!this.bases.has(baseKey(source.base))) throw new Error(`base ${baseKey(source.base)} does not exist`);
      base = source.base;
    } else {
      const src = this.roots.get(source.boxId);
      if (!src) throw new Error(`box root ${source.boxId} does not exist`);
      if (source.snapshot !== undefined && !src.snapshots.has(source.snapshot)) throw new Error(`box ${source.boxId} has no snapshot ${source.snapshot}`);
      base = src.base;
      ids = src.idMap;
    }
    this.roots.set(boxId, { source, base, storageGb, idMap: ids, snapshots: new Map() });
    return this.boxRootPath(boxId);
  }

  /** A mock root is always in its range already: nothing to ready. */
  async prepareBoxRoot(boxId: string): Promise<string> {
    this.fault('prepareBoxRoot');
    if (!this.roots.has(boxId)) throw new Error(`box root ${boxId} does not exist`);
    return this.boxRootPath(boxId);
  }

  boxRootMount(boxId: string): string {
    return this.boxRootPath(boxId);
  }

  boxRootPath(boxId: string): string {
    this.fault('boxRootPath');
    return path.join(this.opts.mountRoot ?? '/mock-zfs', 'boxes', boxId);
  }

  async hasBoxRoot(boxId: string): Promise<boolean> {
    this.fault('hasBoxRoot');
    return this.roots.has(boxId);
  }

  async destroyBoxRoot(boxId: string): Promise<void> {
    this.fault('destroyBoxRoot');
    const gone = this.roots.get(boxId);
    if (!gone) return;
    for (const r of this.roots.values()) {
      if (r.source.kind === 'box' && r.source.boxId === boxId) r.source = gone.source;
    }
    this.roots.delete(boxId);
  }

  async listBoxRoots(): Promise<string[]> {
    this.fault('listBoxRoots');
    return [...this.roots.keys()];
  }

  async snapshotBoxRoot(boxId: string, snapshot: string, description?: string): Promise<void> {
    this.fault('snapshotBoxRoot');
    const r = this.roots.get(boxId);
    if (!r) throw new Error(`box root ${boxId} does not exist`);
    if (!r.snapshots.has(snapshot)) r.snapshots.set(snapshot, { createdAt: new Date().toISOString(), description });
  }

  /** Forks made from the snapshot keep working: the mock holds no data they could lose. */
  async destroyBoxSnapshot(boxId: string, snapshot: string): Promise<void> {
    this.fault('destroyBoxSnapshot');
    this.roots.get(boxId)?.snapshots.delete(snapshot);
  }

  async listBoxSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    this.fault('listBoxSnapshots');
    const r = this.roots.get(boxId);
    if (!r) throw new Error(`box root ${boxId} does not exist`);
    return [...r.snapshots].map(([name, s]) => ({ name, createdAt: s.createdAt, sizeBytes: 0, ...(s.description ? { description: s.description } : {}) }));
  }

  /** Later snapshots block a rollback; forks made after it, the mock does not track. */
  async rollbackBlockers(boxId: string, snapshot: string): Promise<{ snapshots: string[]; forks: string[] }> {
    this.fault('rollbackBlockers');
    const names = (await this.listBoxSnapshots(boxId)).map((s) => s.name);
    const at = names.indexOf(snapshot);
    if (at < 0) throw new Error(`box ${boxId} has no snapshot ${snapshot}`);
    return { snapshots: names.slice(at + 1), forks: [] };
  }

  async rollbackBoxRoot(boxId: string, snapshot: string): Promise<void> {
    this.fault('rollbackBoxRoot');
    const blockers = await this.rollbackBlockers(boxId, snapshot);
    if (blockers.snapshots.length) throw new StorageInUseError(`box ${boxId} has snapshots after ${snapshot}`, blockers.snapshots.map((n) => `snapshot ${n}`));
    this.rollbacks.push(`${boxId}@${snapshot}`);
  }
}

/** Bytes of the regular files under `dir`. */
async function sizeOf(dir: string): Promise<number> {
  let total = 0;
  for (const e of await fs.promises.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += await sizeOf(p);
    else if (e.isFile()) total += (await fs.promises.stat(p)).size;
  }
  return total;
}
