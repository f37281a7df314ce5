import './childEnv'; // first: Node children of a test start without tap's hook
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import type { Test } from 'tap';
import { loadConfig, Config } from '../../core/config';
import { startHost, Host, HostOptions } from '../../server/host';
import { cleanupHost } from './cleanup';
import { claimDir, ownerStamp, stampOwner } from './owner';
import { makePgSchema, PgSchema, testDbKind } from './db';

export interface TestHost extends Host {
  url: string;
  /** Every log line the host wrote, parsed. */
  logs: any[];
  call(method: string, path: string, opts?: CallOptions): Promise<CallResult>;
}

export interface CallOptions {
  body?: unknown;
  /** A raw body (sent as is, with the given content type). */
  raw?: string | Buffer;
  contentType?: string;
  /** Defaults to the admin token; null sends none. */
  token?: string | null;
  headers?: Record<string, string>;
}

export interface CallResult {
  status: number;
  headers: Headers;
  body: any;
  text: string;
}

export function testDataDir(): string {
  return claimDir(fs.mkdtempSync(path.join(os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir(), 'bh-test-')));
}

/** Where test processes claim their hosts' /16s: one file per second octet holding the pid. */
const SUBNET_CLAIMS = '/run/boxhost-test-subnets';

/** Second octets of the 10.x routes the machine has now (a live host's or a killed run's bridges). */
function routedOctets(): Set<number> {
  const out = new Set<number>();
  const table = fs.existsSync('/proc/net/route') ? fs.readFileSync('/proc/net/route', 'utf8') : '';
  for (const line of table.split('\n').slice(1)) {
    const dest = line.split('\t')[1];
    // Little-endian hex: "0000650A" is 10.101.0.0.
    if (dest && dest.length === 8 && dest.slice(6) === '0A') out.add(parseInt(dest.slice(4, 6), 16));
  }
  return out;
}

/** This process's claims, dropped as it exits. */
const myClaims = new Set<string>();
process.on('exit', () => {
  for (const c of myClaims) fs.rmSync(c, { force: true });
});

/**
 * A /16 of 10.100–199 per test host that no other host alive on the machine has: the suite runs
 * several files at once, each with hosts of its own, and two hosts on one /16 would give their
 * projects' bridges the same addresses (a box of one unreachable from the host). A claim is a
 * file holding the claiming process's stamp (test/helpers/owner.ts: pid and start time), taken
 * over once that process is gone; a /16 with a route already (a bridge another run left) is
 * passed over.
 */
export function testSubnet(): string {
  fs.mkdirSync(SUBNET_CLAIMS, { recursive: true });
  const routed = routedOctets();
  const octets = Array.from({ length: 100 }, (_, i) => 100 + i).sort(() => Math.random() - 0.5);
  for (const x of octets) {
    if (routed.has(x)) continue;
    const claim = path.join(SUBNET_CLAIMS, String(x));
    for (let tries = 0; tries < 2; tries++) {
      try {
        fs.writeFileSync(claim, ownerStamp(), { flag: 'wx' });
        myClaims.add(claim);
        return `10.${x}.0.0/16`;
      } catch {
        // Gone since (its holder exited): try again. Empty: its maker has not written it yet.
        let text: string;
        try {
          text = fs.readFileSync(claim, 'utf8');
        } catch {
          continue;
        }
        if (!text || stampOwner(text) !== null) break;
        fs.rmSync(claim, { force: true });
      }
    }
  }
  return `10.${100 + Math.floor(Math.random() * 100)}.0.0/16`;
}

export function testConfig(env: Record<string, string> = {}): Config {
  return loadConfig(
    {
      // A dir is made only when none is given (one made and then overridden was left behind).
      BOXHOST_DATA_DIR: env.BOXHOST_DATA_DIR ?? testDataDir(),
      BOXHOST_PORT: '0',
      BOXHOST_AGENT_PORT: '0',
      BOXHOST_PROXY_PORT: '0',
      BOXHOST_CLUSTER_SECRET: `test-secret-${crypto.randomBytes(12).toString('hex')}`,
      LOG_LEVEL: 'warn',
      BOXHOST_BOX_SUBNET: testSubnet(),
      BOXHOST_POOL_SIZE_GB: '8',
      // Test pools are small and sparse; admission itself is tested with its own figures.
      BOXHOST_STORAGE_OVERCOMMIT: '100',
      ...env,
    },
    { readDotenv: false },
  );
}

export async function request(baseUrl: string, method: string, p: string, token: string | null, opts: CallOptions = {}): Promise<CallResult> {
  const headers: Record<string, string> = { ...(opts.headers ?? {}) };
  const tok = opts.token === undefined ? token : opts.token;
  if (tok) headers.authorization = `Bearer ${tok}`;
  let body: string | Buffer | undefined;
  if (opts.raw !== undefined) {
    body = opts.raw;
    headers['content-type'] = opts.contentType ?? 'application/json';
  } else if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['content-type'] = 'application/json';
  }
  const res = await fetch(`${baseUrl}${p}`, { method, headers, body });
  const text = await res.text();
  let parsed: any = undefined;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}

/**
 * A real host (api + worker unless told otherwise) on a temp data dir, torn down with the test.
 * Its database is the sqlite file in the data dir, or with `BOXHOST_TEST_DB=postgres` a fresh
 * schema of the test PostgreSQL (dropped with the host), unless `env` names a DATABASE_URL.
 */
export async function startTestHost(t: Test, env: Record<string, string> = {}, opts: Partial<HostOptions> = {}): Promise<TestHost> {
  let schema: PgSchema | undefined;
  if (testDbKind() === 'postgres' && env.DATABASE_URL === undefined) {
    schema = await makePgSchema();
    env = { ...env, DATABASE_URL: schema.url };
  }
  const config = testConfig(env);
  const logs: any[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line) logs.push(JSON.parse(line));
      cb();
    },
  });
  const log = pino({ level: 'info' }, sink);
  let host: Host;
  try {
    host = await startHost(config, { roles: ['api', 'node'], log, ...opts });
  } catch (e) {
    await cleanupHost(config);
    await schema?.drop().catch(() => undefined);
    throw e;
  }
  // Each step runs whatever the one before did: a teardown that throws would skip the rest.
  t.teardown(async () => {
    await host.close().catch((e) => process.stderr.write(`# closing the test host ${config.dataDir} failed: ${(e as Error).message}\n`));
    await cleanupHost(config);
    await schema?.drop().catch((e) => process.stderr.write(`# cleanup: dropping schema ${schema!.schema} failed: ${(e as Error).message}\n`));
  });
  const th = host as TestHost;
  th.logs = logs;
  th.call = (method, p, o) => request(th.url, method, p, host.adminToken, o);
  return th;
}

