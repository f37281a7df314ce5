import fs from 'node:fs';
import type { Config } from '../../core/config';
import { ZfsStorage } from '../../workers/storage/zfs';
import { RuncRuntime } from '../../workers/runtime/runc';
import { CniNetwork } from '../../workers/network/cni';
import { leftoversOf } from './leftovers';

/** Where cleanup problems go: stderr, which tap shows beside the test's output (and `.ci/run`
 *  keeps in its log). */
const toStderr = (line: string) => process.stderr.write(`# cleanup: ${line}\n`);

/**
 * Removes everything a test host made on the machine: containers, netns, user namespaces,
 * bridges, firewall chains, its loop-file pool, its data dir. Nothing it cannot remove is
 * hidden: each failed step, and whatever of the host is still there afterwards, is reported
 * (and returned); `test/zz-leftovers.test.ts` fails the suite on anything left at its end.
 */
export async function cleanupHost(config: Config, report: (line: string) => void = toStderr): Promise<string[]> {
  const problems: string[] = [];
  const step = async (what: string, fn: () => Promise<unknown>) => {
    try {
      await fn();
    } catch (e) {
      problems.push(`${what}: ${(e as Error).message.split('\n').slice(0, 3).join(' ')}`);
    }
  };
  const runtime = new RuncRuntime({ dataDir: config.dataDir, hostTag: config.hostTag });
  await step('listing containers', async () => {
    for (const c of await runtime.list()) await step(`removing container of box ${c.boxId}`, () => runtime.remove(c.boxId));
  });
  const network = new CniNetwork({ dataDir: config.dataDir, hostTag: config.hostTag, boxSubnet: config.boxSubnet, outbound: false });
  await step('removing netns, bridges and chains', () => network.destroyAll());
  // User namespaces whose netns is gone (a box made but never started, whose container
  // `remove` never saw) are let go the way reconciliation lets them go.
  await step('releasing user namespaces', () => runtime.tidy());
  const storage = new ZfsStorage({ dataDir: config.dataDir, poolSizeGb: config.poolSizeGb, hostTag: config.hostTag });
  // zfs-fuse may hold a pool busy for a while after its last mount went (a loaded machine, a
  // box process still exiting): tried again for up to a minute before it counts as left.
  let poolGone = false;
  await step('destroying the pool', async () => {
    for (let i = 1; ; i++) {
      try {
        await storage.destroyPool();
        poolGone = true;
        return;
      } catch (e) {
        if (i >= 12 || !/busy/i.test(String(e))) throw e;
        await new Promise((r) => setTimeout(r, 5000));
      }
    }
  });
  await step('removing the data dir', async () => {
    // Its pool's image file is in it: never removed under a pool still imported.
    if (!poolGone) throw new Error('kept: its pool could not be destroyed');
    // Never recurse into something still mounted there (a dataset, a root's bind mount).
    const mounted = fs
      .readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4]?.replace(/\\040/g, ' '))
      .filter((p): p is string => !!p && (p === config.dataDir || p.startsWith(`${config.dataDir}/`)));
    if (mounted.length) throw new Error(`still mounted under it: ${mounted.join(', ')}`);
    fs.rmSync(config.dataDir, { recursive: true, force: true });
  });
  // What is still there, of this host only (its tag and data dir).
  await step('looking for leftovers', async () => {
    for (const l of await leftoversOf({ hostTag: config.hostTag, dataDir: config.dataDir })) problems.push(`left: ${l}`);
  });
  for (const p of problems) report(`${config.dataDir} (tag ${config.hostTag}): ${p}`);
  return problems;
}
