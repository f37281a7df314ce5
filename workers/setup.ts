import dns from 'node:dns';
import net from 'node:net';
import { urlHost } from '../core/addressPolicy';
import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import { ZfsStorage } from './storage/zfs';
import { ZfsVolumes } from './storage/zfsVolumes';
import { RuncRuntime } from './runtime/runc';
import { CniNetwork } from './network/cni';
import type { NetworkDriver, RuntimeDriver, StorageDriver, VolumeDriver } from './drivers';
import type { WorkerContext } from './context';
import { ensureDefaultBase } from './bases/defaultBase';
import { reconcile } from './reconcile';
import { raiseKeyQuota } from './keyQuota';
import { NetLayout } from '../core/netblocks';

export interface Drivers {
  storage: StorageDriver;
  runtime: RuntimeDriver;
  network: NetworkDriver;
  /** Data volumes, on the storage's pool. */
  volumes: VolumeDriver;
}

/** The host drivers of this machine: ZFS, runc, CNI. */
export function createDrivers(config: Config, log: Logger): Drivers {
  const storage = new ZfsStorage({
      dataDir: config.dataDir,
      pool: config.zfsPool,
      poolSizeGb: config.poolSizeGb,
      hostTag: config.hostTag,
      concurrency: config.zfsConcurrency,
      fuseArcMb: config.zfsFuseArcMb,
      // With the watchdog on, a daemon hung while the node starts is restarted too (storage/zfsPool.ts init).
      startHangMs: config.storageWatchdog.intervalMs > 0 ? 2 * config.storageWatchdog.hangMs : undefined,
      logger: log.child({ driver: 'zfs' }),
  });
  return {
    storage,
    volumes: new ZfsVolumes(storage.kit()),
    runtime: new RuncRuntime({ dataDir: config.dataDir, hostTag: config.hostTag, logger: log.child({ driver: 'runc' }) }),
    network: new CniNetwork({
      dataDir: config.dataDir,
      hostTag: config.hostTag,
      boxSubnet: config.boxSubnet,
      projectPrefix: config.projectPrefix,
      outbound: config.boxOutbound,
      protectedDestinations: () => platformDestinations(config),
      logger: log.child({ driver: 'cni' }),
    }),
  };
}

/**
 * What boxes must never reach even with outbound on, besides link-local and the host itself:
 * the addresses of the Redis and PostgreSQL hosts this node uses (resolved now: a platform
 * that moves is re-read at the next node start), and BOXHOST_PROTECTED_NETS (other nodes'
 * agents) as given. A host name that does not resolve fails the start rather than leave the
 * service open to boxes.
 */
export async function platformDestinations(config: Pick<Config, 'redisUrl' | 'databaseUrl' | 'protectedNets'>): Promise<string[]> {
  const out = [...config.protectedNets];
  for (const url of [config.redisUrl, config.databaseUrl].filter((u): u is string => Boolean(u))) {
    const host = urlHost(url);
    if (!host) continue; // a unix socket or a sqlite file
    if (net.isIP(host)) {
      out.push(host);
      continue;
    }
    const addrs = await dns.promises.lookup(host, { all: true }).catch((e: Error) => {
      throw new Error(`cannot resolve ${host} (of ${url.replace(/\/\/[^@/]*@/, '//')}) to keep it out of the boxes' reach: ${e.message}`);
    });
    out.push(...addrs.map((a) => a.address));
  }
  return [...new Set(out)];
}

/** What a node does before taking jobs: pool, firewall, the default base, reconciliation. */
export async function prepareHost(ctx: WorkerContext): Promise<void> {
  await ctx.storage.init();
  await ctx.network.init();
  // runc's session keyrings (not the mock's) count against a per-uid kernel quota.
  if (ctx.runtime instanceof RuncRuntime) await raiseKeyQuota(new NetLayout(ctx.config.boxSubnet, ctx.config.projectPrefix).boxesPerProject, ctx.log);
  await ensureDefaultBase(ctx);
  await reconcile(ctx);
}
