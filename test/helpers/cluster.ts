import { spawn, spawnSync, ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Test } from 'tap';
import { loadConfig } from '../../core/config';
import { run, sleep } from '../../core/command';
import { randomId } from '../../core/ids';
import { cleanupHost } from './cleanup';
import { makePgSchema, PG } from './db';
import { testDataDir, testSubnet } from './host';

export { PG };
export const REDIS = process.env.BOXHOST_TEST_REDIS ?? 'redis://127.0.0.1:6379';
const NOBODY = '65534';
const repoRoot = path.resolve(__dirname, '..', '..', '..');

export const freePort = () =>
  new Promise<number>((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });

/** A schema of its own in the shared PostgreSQL, dropped with the test: its DATABASE_URL. */
export async function pgSchema(t: Test): Promise<string> {
  const s = await makePgSchema();
  t.teardown(() => s.drop());
  return s.url;
}

/** One process of the cluster (`node dist/server/main.js <role>`; `host`: no role, api and node
 *  in one process as `npm start` runs them), its output kept. */
export class RoleProcess {
  child!: ChildProcess;
  output = '';

  constructor(
    readonly role: 'api' | 'node' | 'worker' | 'host',
    readonly env: Record<string, string>,
    private readonly argv0: string[] = [],
    private readonly cwd = repoRoot,
  ) {}

  start(): this {
    const main = path.join(this.cwd, 'dist', 'server', 'main.js');
    const [cmd, ...pre] = this.argv0.length ? this.argv0 : [process.execPath];
    const roleArg = this.role === 'host' ? [] : [this.role];
    const args = this.argv0.length ? [...pre, 'node', main, ...roleArg] : [main, ...roleArg];
    this.output = '';
    this.child = spawn(cmd, args, { env: this.env, cwd: this.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    const keep = (b: Buffer) => {
      this.output = (this.output + b.toString()).slice(-200_000);
    };
    this.child.stdout!.on('data', keep);
    this.child.stderr!.on('data', keep);
    return this;
  }

  get alive(): boolean {
    return this.child && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Resolves with the first log line matching `re`; rejects if the process exits first. */
  async waitFor(re: RegExp, timeoutMs = 60_000): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this.output.match(re);
      if (m) return m;
      if (!this.alive) throw new Error(`${this.role} exited (${this.child.exitCode ?? this.child.signalCode}):\n${this.output.slice(-3000)}`);
      if (Date.now() > deadline) throw new Error(`${this.role}: no ${re} within ${timeoutMs} ms:\n${this.output.slice(-3000)}`);
      await sleep(50);
    }
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (!this.alive) return;
    const gone = new Promise((r) => this.child.once('exit', r));
    this.child.kill(signal);
    if (signal === 'SIGKILL' || signal === 'SIGTERM') await gone;
  }
}

/** What every process of one test cluster shares: db, Redis, prefix, secret, timings. */
export function clusterEnv(databaseUrl: string): Record<string, string> {
  return {
    DATABASE_URL: databaseUrl,
    REDIS_URL: REDIS,
    BOXHOST_REDIS_PREFIX: `bhtest-${randomId(8)}`,
    BOXHOST_CLUSTER_SECRET: `cluster-${crypto.randomBytes(16).toString('hex')}`,
    BOXHOST_ADMIN_TOKEN: `admin-${crypto.randomBytes(16).toString('hex')}`,
    BOXHOST_HEARTBEAT_SECS: '0.5',
    BOXHOST_NODE_TIMEOUT_SECS: '3',
    LOG_LEVEL: 'info',
  };
}

/** A node's own environment: data dir, id, subnet slice, agent port; torn down with the test
 *  (processes killed, then its containers, netns, bridges, chains, pool and data dir). */
export function nodeEnv(t: Test, shared: Record<string, string>, id: string, extra: Record<string, string> = {}): Record<string, string> {
  const env = {
    ...(process.env as Record<string, string>),
    ...shared,
    BOXHOST_DATA_DIR: testDataDir(),
    BOXHOST_NODE_ID: id,
    BOXHOST_BOX_SUBNET: testSubnet(),
    BOXHOST_POOL_SIZE_GB: '8',
    BOXHOST_STORAGE_OVERCOMMIT: '100',
    BOXHOST_AGENT_PORT: '0',
    BOXHOST_PROXY_PORT: '0',
    ...extra,
  };
  t.teardown(() => cleanupHost(loadConfig(env, { readDotenv: false })));
  return env;
}

/** Whether uid 65534 can read the built api where it is (every parent directory must let it in). */
function nobodyCanRead(dir: string): boolean {
  const probe = `require('fs').accessSync(${JSON.stringify(path.join(dir, 'dist', 'server', 'main.js'))}, require('fs').constants.R_OK)`;
  const r = spawnSync('setpriv', [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', process.execPath, '-e', probe]);
  return r.status === 0;
}

/**
 * The api as an unprivileged user (uid/gid 65534, no groups, no capabilities) whose PATH holds
 * nothing but `node`: no zfs, runc, ip or iptables is even reachable. When the checkout sits
 * where that user cannot read, it is bind-mounted read-only somewhere it can.
 */
export async function startUnprivilegedApi(t: Test, shared: Record<string, string>): Promise<{ proc: RoleProcess; url: string; proxyUrl: string }> {
  let cwd = repoRoot;
  if (!nobodyCanRead(repoRoot)) {
    cwd = fs.mkdtempSync('/var/tmp/bh-repo-');
    fs.chmodSync(cwd, 0o755);
    await run(['mount', '--bind', '-o', 'ro', repoRoot, cwd]);
    t.teardown(async () => {
      await run(['umount', '-l', cwd], { allowFailure: true });
      fs.rmdirSync(cwd);
    });
  }
  const home = fs.mkdtempSync('/var/tmp/bh-api-');
  fs.chmodSync(home, 0o755);
  const bin = path.join(home, 'bin');
  fs.mkdirSync(bin);
  fs.symlinkSync(process.execPath, path.join(bin, 'node'));
  const dataDir = path.join(home, 'data');
  fs.mkdirSync(dataDir);
  fs.chownSync(dataDir, Number(NOBODY), Number(NOBODY));
  t.teardown(() => fs.rmSync(home, { recursive: true, force: true }));
  const env = { ...shared, PATH: bin, HOME: dataDir, BOXHOST_DATA_DIR: dataDir, BOXHOST_PORT: '0', BOXHOST_HOST: '127.0.0.1' };
  // `env -u NODE_OPTIONS`: tap adds a loader of its own (a file under the checkout, which the
  // unprivileged user may not read) to every child's NODE_OPTIONS; the api runs without it.
  const argv0 = ['/usr/bin/env', '-u', 'NODE_OPTIONS', '/usr/bin/setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', '--inh-caps=-all', '--bounding-set=-all'];
  const proc = new RoleProcess('api', env, argv0, cwd).start();
  t.teardown(() => proc.kill());
  const m = await proc.waitFor(/"url":"(http:\/\/[^"]+)","msg":"api listening"/);
  const px = await proc.waitFor(/"url":"(http:\/\/[^"]+)","domain":"[^"]*","msg":"publish proxy listening"/);
  return { proc, url: m[1], proxyUrl: px[1] };
}
