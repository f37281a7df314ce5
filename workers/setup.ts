import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import { ZfsStorage } from './storage/zfs';
import { RuncRuntime } from './runtime/runc';
import { CniNetwork } from './network/cni';
import type { NetworkDriver, RuntimeDriver, StorageDriver } from './drivers';
import type { WorkerContext } from './context';
import { ensureDefaultBase } from './bases/defaultBase';
import { reconcile } from './reconcile';

export interface Drivers {
  storage: StorageDriver;
  runtime: RuntimeDriver;
  network: NetworkDriver;
}

/** The host drivers of this machine: ZFS, runc, CNI. */
export function createDrivers(config: Config, log: Logger): Drivers {
  return {
    storage: new ZfsStorage({ dataDir: config.dataDir, pool: config.zfsPool, poolSizeGb: config.poolSizeGb, hostTag: config.hostTag, logger: log.child({ driver: 'zfs' }) }),
    runtime: new RuncRuntime({ dataDir: config.dataDir, hostTag: config.hostTag, logger: log.child({ driver: 'runc' }) }),
    network: new CniNetwork({ dataDir: config.dataDir, hostTag: config.hostTag, boxSubnet: config.boxSubnet, outbound: config.boxOutbound, logger: log.child({ driver: 'cni' }) }),
  };
}

/** What a node does before taking jobs: pool, firewall, the default base, reconciliation. */
export async function prepareHost(ctx: WorkerContext): Promise<void> {
  await ctx.storage.init();
  await ctx.network.init();
  await ensureDefaultBase(ctx);
  await reconcile(ctx);
}
