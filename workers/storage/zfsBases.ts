/**
 * Bases on the ZFS storage: `R/bases/<name>/<version>` with its @base snapshot, the copies
 * shifted into each project's id range (`R/shifted/…/<hostId>`, made at first use and kept),
 * and a base saved from a box root (a copy, so neither depends on the other).
 */
import path from 'node:path';
import { CommandError, run, sleep } from '../../core/command';
import { ID_RANGE_SIZE } from '../../core/box';
import { shiftTree, unshiftTree } from '../bases/idShift';
import type { BaseRef, IdMap } from '../drivers';
import { StorageInUseError } from './errors';
import { processAlive } from './hostFs';
import { BASE_SNAPSHOT, checkTag, IDMAP_PROP, INTERNAL, isExists, isMissing, lines, MAKER_PROP, serialized } from './zfsCommon';
import type { ZfsDatasets } from './zfsDatasets';

export class ZfsBases {
  /** Shifted base copies known to be complete: a box create then costs one `zfs clone`. */
  private readonly shiftedMade = new Set<string>();

  constructor(private readonly d: ZfsDatasets) {}

  /** After a storage restart nothing is known made. */
  forget(): void {
    this.shiftedMade.clear();
  }

  async hasBase(base: BaseRef): Promise<boolean> {
    return this.d.exists(`${this.d.baseDataset(base)}@${BASE_SNAPSHOT}`);
  }

  async createBase(base: BaseRef, fill: (dir: string) => Promise<void>): Promise<void> {
    const ds = this.d.baseDataset(base);
    // In this process a second maker waits for the first; it would otherwise see a base being
    // filled as half-made and destroy it.
    await serialized(ds, () => this.makeBase(ds, fill));
  }

  private async makeBase(ds: string, fill: (dir: string) => Promise<void>): Promise<void> {
    if (await this.d.exists(`${ds}@${BASE_SNAPSHOT}`)) return;
    if (await this.d.exists(ds)) {
      this.d.log.warn({ dataset: ds }, 'half-made base (no @base snapshot): destroying it to start again');
      await this.d.destroyDataset(ds);
    }
    await this.d.zfsTolerating(['create', '-p', ds.slice(0, ds.lastIndexOf('/'))], isExists);
    // Without -p: when another process is making the same base, this fails instead of sharing it.
    await this.d.zfs(['create', ds]);
    try {
      await this.d.ensureMounted(ds);
      await fill(await this.d.prop(ds, 'mountpoint'));
      await this.d.zfs(['snapshot', `${ds}@${BASE_SNAPSHOT}`]);
    } catch (e) {
      await this.d.destroyDataset(ds).catch((err) => this.d.log.warn({ dataset: ds, err: String(err) }, 'cleanup of failed base failed'));
      throw e;
    }
    // Box roots are clones of @base; writes to the base itself would only confuse a later export.
    await this.d.zfs(['set', 'readonly=on', ds]);
  }

  /** Destroys a base and its shifted copies; refuses while a box root depends on any of them. */
  async destroyBase(base: BaseRef): Promise<void> {
    const ds = this.d.baseDataset(base);
    if (!(await this.d.exists(ds))) return;
    const copies = `${this.d.root}/shifted/${base.name}/${base.version}`;
    const dependents = (await this.d.descendantsOf(ds)).filter((d) => d !== copies && !d.startsWith(`${copies}/`));
    if (dependents.length > 0) {
      const names = dependents.map((d) => this.d.boxIdOf(d) ?? d);
      throw new StorageInUseError(`base ${base.name}@${base.version} is in use by ${names.length} box root(s): ${names.join(', ')}`, names);
    }
    for (const made of [...this.shiftedMade]) if (made.startsWith(`${copies}/`)) this.shiftedMade.delete(made);
    if (await this.d.exists(copies)) await this.d.destroyDataset(copies);
    await this.d.destroyDataset(ds);
    // The per-name parents go with their last version; a concurrent create makes this fail harmlessly.
    for (const parent of [`${this.d.root}/bases/${base.name}`, `${this.d.root}/shifted/${base.name}`]) {
      const children = await this.d.zfs(['list', '-H', '-o', 'name', '-r', '-d', '1', parent], true);
      if (children.exitCode === 0 && lines(children.stdout).length === 1) {
        await this.d.destroyDataset(parent, false).catch((e) => this.d.log.warn({ dataset: parent, err: String(e) }, 'left an empty base name dataset'));
      }
    }
  }

  async baseSizeBytes(base: BaseRef): Promise<number> {
    return Number(await this.d.prop(`${this.d.baseDataset(base)}@${BASE_SNAPSHOT}`, 'referenced'));
  }

  /** The mounted, read-only directory of a base (for export). */
  baseRootPath(base: BaseRef): string {
    this.d.baseDataset(base);
    return path.join(this.d.mountRoot(), 'bases', base.name, base.version);
  }

  async holdBoxRoot(boxId: string, tag: string): Promise<void> {
    checkTag(tag);
    const hold = `${this.d.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    await this.d.zfsTolerating(['snapshot', hold], isExists);
  }

  /**
   * The held root cloned (read-only) under R/tmp, copied with `cp -a` into the base's dataset
   * (links, modes, owners kept), owners moved back from the range the root's `boxhost:idmap`
   * names; the clone and the hold destroyed whatever happened. A copy, not a clone: the base
   * must not depend on a box that may be deleted, nor the box on the base.
   */
  async baseFromBoxRoot(boxId: string, tag: string, base: BaseRef): Promise<void> {
    checkTag(tag);
    const hold = `${this.d.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    const tmp = `${this.d.root}/tmp/save-${boxId}-${tag}`;
    try {
      if (await this.hasBase(base)) return;
      if (!(await this.d.exists(hold))) throw new Error(`box root ${boxId} has no hold ${tag}`);
      const range = await this.d.prop(hold, IDMAP_PROP);
      await this.d.zfsTolerating(['create', '-p', `${this.d.root}/tmp`], isExists);
      if (await this.d.exists(tmp)) await this.d.destroyDataset(tmp);
      await this.d.zfs(['clone', '-o', 'readonly=on', hold, tmp]);
      await this.d.ensureMounted(tmp);
      const from = await this.d.prop(tmp, 'mountpoint');
      await this.createBase(base, async (dir) => {
        await run(['cp', '-a', '--', `${from}/.`, `${dir}/`], { timeoutMs: 60 * 60_000 });
        if (/^\d+$/.test(range)) await unshiftTree(dir, { hostId: Number(range), size: ID_RANGE_SIZE });
      });
    } finally {
      await this.d.destroyDataset(tmp).catch((e) => this.d.log.warn({ dataset: tmp, err: String(e) }, 'left a temporary clone of a saved root'));
      await this.d.destroySnapshot(hold).catch((e) => this.d.log.warn({ snapshot: hold, err: String(e) }, 'left the hold of a saved root'));
    }
  }

  async releaseBoxRoot(boxId: string, tag: string): Promise<void> {
    checkTag(tag);
    const hold = `${this.d.boxDataset(boxId)}@${INTERNAL}save-${tag}`;
    await this.d.destroyDataset(`${this.d.root}/tmp/save-${boxId}-${tag}`);
    await this.d.destroySnapshot(hold);
  }

  /**
   * The base's copy in `idMap`'s range: `R/shifted/<name>/<version>/<hostId>`, a clone of the
   * base's @base with every owner shifted, and its own @base snapshot. Made once; a copy left
   * half-made (no @base) by a process that is gone is made again, one whose maker still runs
   * (another worker process) is waited for.
   */
  async shiftedBase(base: BaseRef, idMap: IdMap, missing: string): Promise<string> {
    const ds = this.d.shiftedDataset(base, idMap);
    if (this.shiftedMade.has(ds)) return ds;
    await serialized(ds, async () => {
      for (let waited = 0; !(await this.d.exists(`${ds}@${BASE_SNAPSHOT}`)); waited += 250) {
        const maker = await this.d.zfs(['get', '-Hp', '-o', 'value', MAKER_PROP, ds], true);
        if (maker.exitCode !== 0) {
          await this.makeShiftedBase(base, ds, idMap, missing);
          continue;
        }
        const pid = Number(maker.stdout.trim());
        if (pid !== process.pid && processAlive(pid) && waited < 10 * 60_000) {
          await sleep(250);
          continue;
        }
        this.d.log.warn({ dataset: ds }, 'half-made shifted base copy: destroying it to start again');
        await this.d.destroyDataset(ds);
      }
    });
    this.shiftedMade.add(ds);
    return ds;
  }

  private async makeShiftedBase(base: BaseRef, ds: string, idMap: IdMap, missing: string): Promise<void> {
    await this.d.zfsTolerating(['create', '-p', ds.slice(0, ds.lastIndexOf('/'))], isExists);
    const origin = `${this.d.baseDataset(base)}@${BASE_SNAPSHOT}`;
    const r = await this.d.zfs(['clone', '-o', `${MAKER_PROP}=${process.pid}`, origin, ds], true);
    if (r.exitCode !== 0) {
      if (isExists(r.stderr)) return; // another process is making it: the caller waits
      if (isMissing(r.stderr)) throw new Error(missing);
      throw new CommandError([this.d.zfsBin, 'clone', origin, ds], r.exitCode, r.stdout, r.stderr);
    }
    const t0 = Date.now();
    await this.d.ensureMounted(ds);
    const { entries } = await shiftTree(await this.d.prop(ds, 'mountpoint'), idMap);
    await this.d.zfs(['snapshot', `${ds}@${BASE_SNAPSHOT}`]);
    await this.d.zfs(['set', 'readonly=on', ds]);
    this.d.log.info({ base: `${base.name}@${base.version}`, hostId: idMap.hostId, entries, ms: Date.now() - t0 }, "made a base's copy in an id range");
  }
}
