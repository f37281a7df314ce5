import fs from 'node:fs';
import type { Config } from '../../core/config';
import { ZfsStorage } from '../../workers/storage/zfs';
import { RuncRuntime } from '../../workers/runtime/runc';
import { CniNetwork } from '../../workers/network/cni';

/** Removes everything a test host made on the machine: containers, netns, bridges, firewall
 *  chains, its loop-file pool, its data dir. */
export async function cleanupHost(config: Config): Promise<void> {
  const runtime = new RuncRuntime({ dataDir: config.dataDir, hostTag: config.hostTag });
  for (const c of await runtime.list().catch(() => [])) await runtime.remove(c.boxId).catch(() => undefined);
  const network = new CniNetwork({ dataDir: config.dataDir, hostTag: config.hostTag, boxSubnet: config.boxSubnet, outbound: false });
  await network.destroyAll().catch(() => undefined);
  const storage = new ZfsStorage({ dataDir: config.dataDir, poolSizeGb: config.poolSizeGb, hostTag: config.hostTag });
  await storage.destroyPool().catch(() => undefined);
  fs.rmSync(config.dataDir, { recursive: true, force: true });
}
