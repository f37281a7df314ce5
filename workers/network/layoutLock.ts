import fs from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../../core/config';
import { formatIpv4, NetLayout, parseIpv4 } from '../../core/netblocks';
import type { DriverLogger } from '../drivers';

/**
 * The layout lock (docs/decisions.md "Network"): the box subnet and project prefix a node's
 * boxes were given their addresses under, recorded in `<data dir>/cni/layout.json` at the
 * node's first start. A node whose settings later say otherwise would hand a project's next box
 * an address outside the block its bridge and neighbours use, so it refuses to start while any
 * box holds an address; an empty node takes the new layout.
 */

interface LayoutFile {
  subnet: string;
  projectPrefix: number;
  recordedAt: string;
}

/** Nodes made before the prefix was configurable: a /24 per project of a /16 subnet. */
export const LEGACY_PROJECT_PREFIX = 24;

export const layoutFile = (dataDir: string) => path.join(dataDir, 'cni', 'layout.json');

/** The recorded layout, or null when none was recorded. A file that does not parse is an
 *  error: guessing could move every box. */
export async function readLayout(dataDir: string): Promise<NetLayout | null> {
  const file = layoutFile(dataDir);
  let text: string;
  try {
    text = await fs.promises.readFile(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
  try {
    const f = JSON.parse(text) as LayoutFile;
    return new NetLayout(f.subnet, f.projectPrefix);
  } catch (e) {
    throw new ConfigError(`${file} does not hold a network layout (${(e as Error).message}); restore it, or remove it from a node that holds no boxes`);
  }
}

/** Written whole (temp file, then rename): a crash leaves the old record or the new one. */
export async function writeLayout(dataDir: string, layout: NetLayout): Promise<void> {
  const file = layoutFile(dataDir);
  await fs.promises.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  const body: LayoutFile = { subnet: layout.subnet, projectPrefix: layout.projectPrefix, recordedAt: new Date().toISOString() };
  const tmp = `${file}.${process.pid}.tmp`;
  await fs.promises.writeFile(tmp, `${JSON.stringify(body, null, 2)}\n`, { mode: 0o600 });
  await fs.promises.rename(tmp, file);
}

/** What may go on under `now` given the recorded layout: the same, or one that keeps every
 *  block where it was (the subnet widened from the same first address). */
export const compatible = (was: NetLayout, now: NetLayout) => now.keeps(was);

/**
 * The start refusal: names both variables, the recorded and the configured values, what holds
 * the node to the recorded ones, and the ways out.
 */
export function layoutChanged(dataDir: string, was: NetLayout, now: NetLayout, held: number, legacy: boolean): ConfigError {
  const where = legacy ? `by a boxhost older than BOXHOST_PROJECT_PREFIX (a /${LEGACY_PROJECT_PREFIX} per project)` : `(recorded in ${layoutFile(dataDir)})`;
  return new ConfigError(
    `this node's box networks were laid out with ${was.describe()} ${where}, and ${held} ${held === 1 ? 'box holds' : 'boxes hold'} addresses there; ` +
      `it is now set to ${now.describe()}, which would move them. Set BOXHOST_BOX_SUBNET and BOXHOST_PROJECT_PREFIX back to the recorded values ` +
      `(widening BOXHOST_BOX_SUBNET from the same first address is allowed), or delete this node's boxes first`,
  );
}

/** What the lock needs of the network driver. */
export interface LayoutState {
  /** Every address host-local has leased in the data dir, whatever the layout. */
  leased(): Promise<string[]>;
  /** Removes every project bridge and IPAM state of the data dir (none is leased). */
  dropAll(): Promise<void>;
}

/** The layout of a data dir made before the lock: a /24 per project of the /16 that holds
 *  `leased` (the only layout that version had). */
function legacyLayout(leased: string): NetLayout {
  const a = parseIpv4(leased) ?? 0;
  return new NetLayout(`${formatIpv4(a - (a % 2 ** 16))}/16`, LEGACY_PROJECT_PREFIX);
}

/**
 * At a node's start (the network driver's `init`): the first records the layout. Under another
 * one, a later start refuses while any box holds an address (a lease), unless the new layout
 * keeps every block where it was (the subnet widened from the same first address); with no
 * lease it drops what the old layout left and records the new one. A data dir of a version
 * before the lock, with leases and no record, was laid out with a /24 per project.
 */
export async function lockLayout(dataDir: string, layout: NetLayout, state: LayoutState, log?: DriverLogger): Promise<void> {
  const recorded = await readLayout(dataDir);
  if (recorded?.describe() === layout.describe()) return;
  const leased = await state.leased();
  const legacy = !recorded && leased.length > 0;
  const was = recorded ?? (legacy ? legacyLayout(leased[0]) : null);
  if (!was || !compatible(was, layout)) {
    if (was && leased.length > 0) throw layoutChanged(dataDir, was, layout, leased.length, legacy);
    await state.dropAll();
  }
  await writeLayout(dataDir, layout);
  log?.info({ layout: layout.describe(), was: was?.describe() ?? null }, 'network layout recorded');
}

/** Before the first attach of a process that never ran `init` (a `worker` beside its node): a
 *  worker set up unlike its node would hand out addresses outside the blocks the node's
 *  bridges use. Either layout keeping the other's blocks is fine. */
export async function checkLayout(dataDir: string, layout: NetLayout, state: LayoutState): Promise<void> {
  const recorded = await readLayout(dataDir);
  if (recorded && !compatible(recorded, layout) && !compatible(layout, recorded)) throw layoutChanged(dataDir, recorded, layout, (await state.leased()).length, false);
}
