import { spawn, ChildProcess } from 'node:child_process';
import type { TestHost } from './host';

/** A worker in its own process (so a test can kill it), on the same data dir as the api. */
export function startWorkerProcess(host: TestHost): Promise<ChildProcess> {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    BOXHOST_DATA_DIR: host.config.dataDir,
    BOXHOST_BOX_SUBNET: host.config.boxSubnet,
    BOXHOST_POOL_SIZE_GB: String(host.config.poolSizeGb),
    BOXHOST_STORAGE_OVERCOMMIT: String(host.config.overcommit.storage),
    BOXHOST_CLUSTER_SECRET: host.config.clusterSecret,
    BOXHOST_AGENT_PORT: '0',
    LOG_LEVEL: 'warn',
  };
  const child = spawn(process.execPath, [require.resolve('../fixtures/worker')], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      if (b.toString().includes('worker ready')) resolve(child);
    });
    child.on('exit', (code) => reject(new Error(`worker exited ${code}`)));
  });
}

export async function killWorker(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}
