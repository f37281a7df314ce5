import { spawn, ChildProcess } from 'node:child_process';
import type { TestHost } from './host';

/** A worker in its own process (so a test can kill it), on the same data dir and database as
 *  the api. `env` adds to its environment (BOXHOST_TEST_CRASH_AT: the step it dies at). */
export type WorkerProcess = ChildProcess & { /** What it wrote on stdout (its log lines). */ output: string };

export function startWorkerProcess(host: TestHost, extra: Record<string, string> = {}): Promise<WorkerProcess> {
  const inherited = { ...process.env };
  delete inherited.BOXHOST_TEST_CRASH_AT;
  const env: NodeJS.ProcessEnv = {
    ...inherited,
    BOXHOST_DATA_DIR: host.config.dataDir,
    BOXHOST_BOX_SUBNET: host.config.boxSubnet,
    BOXHOST_POOL_SIZE_GB: String(host.config.poolSizeGb),
    BOXHOST_STORAGE_OVERCOMMIT: String(host.config.overcommit.storage),
    BOXHOST_CLUSTER_SECRET: host.config.clusterSecret,
    BOXHOST_AGENT_PORT: '0',
    BOXHOST_PROXY_PORT: '0',
    LOG_LEVEL: 'warn',
    ...(host.config.databaseUrl ? { DATABASE_URL: host.config.databaseUrl } : {}),
    ...extra,
  };
  const child = spawn(process.execPath, [require.resolve('../fixtures/worker')], { env, stdio: ['ignore', 'pipe', 'inherit'] }) as WorkerProcess;
  child.output = '';
  return new Promise((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => {
      child.output = (child.output + b.toString()).slice(-500_000);
      if (child.output.includes('worker ready')) resolve(child);
    });
    child.on('exit', (code, signal) => reject(new Error(`worker exited ${code ?? signal}`)));
  });
}

/** Resolves with how the worker ended (its exit code, or the signal that ended it). */
export function workerExit(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

export async function killWorker(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}
