/** The bench's host: its config, the profiler's wrapping of its drivers and repos, and a second
 *  api process that reaches the node only through its agent. */
import { spawn, ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig, Config } from '../core/config';
import type { Host } from '../server/host';
import { operationsRepo } from '../db/repos/operations';
import { boxesRepo } from '../db/repos/boxes';
import { projectsRepo } from '../db/repos/projects';
import type { Profiler } from './profile';

export function benchConfig(extra: Record<string, string> = {}): Config {
  const base = os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir();
  return loadConfig(
    {
      BOXHOST_DATA_DIR: fs.mkdtempSync(path.join(base, 'bh-bench-')),
      BOXHOST_PORT: '0',
      BOXHOST_PROXY_PORT: '0',
      LOG_LEVEL: 'warn',
      BOXHOST_BOX_SUBNET: `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`,
      // Set, so that startHost does not print a generated one.
      BOXHOST_ADMIN_TOKEN: crypto.randomBytes(24).toString('hex'),
      // The in-process node starts its agent, for the api process that runs apart.
      BOXHOST_CLUSTER_SECRET: crypto.randomBytes(24).toString('hex'),
      BOXHOST_AGENT_PORT: '0',
      // The bench measures speed, not admission: its boxes promise more than its small sparse
      // pool and this machine's RAM hold.
      BOXHOST_STORAGE_OVERCOMMIT: '1000',
      BOXHOST_RAM_OVERCOMMIT: '100',
      // The deploy figure's replaced generation stops within its load.
      BOXHOST_DEPLOY_DRAIN_SECS: '3',
      ...extra,
    },
    { readDotenv: false },
  );
}

/** Times the host's driver methods and repo calls (the per-step breakdown of the report). */
export function profileHost(host: Host, profiler: Profiler): void {
  const ctx = host.node!.ctx;
  profiler.wrap(ctx.storage, 'storage', ['createBoxRoot', 'prepareBoxRoot', 'destroyBoxRoot']);
  profiler.wrap(ctx.network, 'network', ['attach', 'detach']);
  profiler.wrap(ctx.runtime, 'runtime', ['start', 'ownsNetns', 'makeNetns', 'writeEnvironment', 'exec', 'remove', 'stop', 'status']);
  profiler.wrap(operationsRepo, 'db operations', ['get', 'insert', 'update', 'earlierUnfinished']);
  profiler.wrap(boxesRepo, 'db boxes', Object.keys(boxesRepo));
  profiler.wrap(projectsRepo, 'db projects', Object.keys(projectsRepo));
  if (host.api) profiler.wrap(host.api.queue, 'api queue', ['enqueue', 'waitFor']);
}

/**
 * A second api process on the same host (same sqlite file and embedded Redis), without a node of
 * its own: it reaches the node only through the node agent, as an api on another machine would.
 */
export async function startRemoteApi(config: Config): Promise<{ child: ChildProcess; url: string }> {
  const main = path.resolve(__dirname, '..', 'server', 'main.js');
  const env = {
    ...process.env,
    BOXHOST_DATA_DIR: config.dataDir,
    BOXHOST_PORT: '0',
    BOXHOST_PROXY_PORT: '0',
    BOXHOST_ADMIN_TOKEN: config.adminToken!,
    BOXHOST_CLUSTER_SECRET: config.clusterSecret!,
    BOXHOST_BOX_SUBNET: config.boxSubnet,
    LOG_LEVEL: 'info',
  };
  const child = spawn(process.execPath, [main, 'api'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  // Only the last few KiB are kept (for an exit's message), and the address is looked for only
  // until it is found: the bench's process also runs the node agent the exec figure goes
  // through, and scanning a log that grows by a line per request would tax that figure.
  let out = '';
  let url = '';
  const take = (b: Buffer) => {
    out = (out + b.toString()).slice(-8192);
  };
  child.stderr!.on('data', take);
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      take(b);
      if (url) return;
      const m = /"url":"(http:\/\/[^"]+)","msg":"api listening"/.exec(out);
      if (m) {
        url = m[1];
        resolve();
      }
    });
    child.on('exit', (code) => reject(new Error(`the second api exited ${code}: ${out.slice(-2000)}`)));
  });
  return { child, url };
}
