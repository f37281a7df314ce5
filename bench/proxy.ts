import { spawn } from 'node:child_process';
import path from 'node:path';
import { spawnCollect } from './raw';
import type { Api } from './api';

/**
 * The publish proxy against the box's own address (issue 10): a small keep-alive Go server
 * (bench/httpd/main.go, built here with Debian's Go, copied in through the files API) in a box as
 * a service, published; autocannon (its own process, so it does not share the proxy's event loop)
 * fires the same load straight at the box's address and through the proxy, alternating, in the
 * same run. Target: ≥ 0.7× the direct rate, ≤ 2 ms added p99. Go's standard-library reverse proxy
 * (bench/refproxy) takes the same load in the same rounds, as a reference for what this machine allows.
 */

export interface LoadFigure {
  rps: number;
  p50: number;
  p99: number;
}

export interface ProxySamples {
  direct: LoadFigure;
  proxied: LoadFigure;
  /** The same load through Go's standard-library reverse proxy (bench/refproxy), same run. */
  reference: LoadFigure;
}

const ROOT = path.resolve(__dirname, '..', '..');
const AUTOCANNON = path.join(ROOT, 'node_modules', 'autocannon', 'autocannon.js');

/** Builds bench/<name>/main.go (static, nothing downloaded) into `dir`; its path. */
async function buildGo(dir: string, name: string): Promise<string> {
  const out = path.join(dir, `bench-${name}`);
  const r = await spawnCollect(['env', 'CGO_ENABLED=0', 'GOPROXY=off', 'GO111MODULE=off', 'GOTOOLCHAIN=local', `GOCACHE=${path.join(ROOT, '.cache', 'go-build')}`, `GOPATH=${path.join(ROOT, '.cache', 'go')}`,
    'go', 'build', '-trimpath', '-ldflags=-s -w', '-o', out, path.join(ROOT, 'bench', name, 'main.go')]);
  if (r.code !== 0) throw new Error(`building bench/${name} failed: ${r.stderr}`);
  return out;
}

/** bench/refproxy in front of `target`: its URL, and how to stop it. */
async function startReference(dir: string, target: string): Promise<{ url: string; stop: () => void }> {
  const child = spawn(await buildGo(dir, 'refproxy'), [target], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.once('data', (b: Buffer) => resolve(Number(b.toString().trim())));
    child.once('exit', (code) => reject(new Error(`bench/refproxy exited ${code}`)));
  });
  return { url: `http://127.0.0.1:${port}/`, stop: () => child.kill() };
}

async function load(url: string, host: string | undefined, seconds: number, connections: number): Promise<LoadFigure> {
  const args = [AUTOCANNON, '--json', '-c', String(connections), '-d', String(seconds), ...(host ? ['-H', `host=${host}`] : []), url];
  const r = await spawnCollect([process.execPath, ...args]);
  const o = JSON.parse(r.stdout);
  if (o.non2xx > 0 || o.errors > 0) throw new Error(`autocannon against ${url}: ${o.non2xx} non-2xx, ${o.errors} errors`);
  return { rps: o.requests.average, p50: o.latency.p50, p99: o.latency.p99 };
}

const mean = (xs: LoadFigure[]): LoadFigure => ({
  rps: xs.reduce((a, x) => a + x.rps, 0) / xs.length,
  p50: xs.reduce((a, x) => a + x.p50, 0) / xs.length,
  p99: xs.reduce((a, x) => a + x.p99, 0) / xs.length,
});

export async function benchProxy(opts: { api: Api; project: string; box: string; address: string; proxyUrl: string; scratch: string; seconds: number; rounds: number; connections: number }): Promise<ProxySamples> {
  const { api, project, box } = opts;
  const base = `/v1/projects/${project}/boxes/${box}`;
  const bin = await buildGo(opts.scratch, 'httpd');
  const up = await spawnCollect(['curl', '-sS', '-o', '/dev/null', '-w', '%{http_code}', '-H', `Authorization: Bearer ${api.token}`, '-H', 'Content-Type: application/octet-stream', '-T', bin, `${api.url}${base}/files?path=/usr/local/bin/bench-httpd&mode=0755`]);
  if (up.stdout.trim() !== '200') throw new Error(`copying bench-httpd into the box failed: ${up.stdout} ${up.stderr}`);
  const svc = await api.call('POST', `${base}/services`, { name: 'bench-www', command: ['/usr/local/bin/bench-httpd', ':8088'], port: 8088, publish: { name: 'bench' }, ready: { http: '/', timeout_secs: 20 } });
  if (svc.status !== 201 && svc.status !== 200) throw new Error(`starting the service failed: ${JSON.stringify(svc.body)}`);
  const host = new URL(svc.body.url).host;
  const direct: LoadFigure[] = [];
  const proxied: LoadFigure[] = [];
  const reference: LoadFigure[] = [];
  const ref = await startReference(opts.scratch, `http://${opts.address}:8088`);
  try {
    // Warm every path (connections, the proxy's route cache), then take turns.
    await load(`http://${opts.address}:8088/`, undefined, 1, opts.connections);
    await load(`${opts.proxyUrl}/`, host, 1, opts.connections);
    await load(ref.url, undefined, 1, opts.connections);
    for (let i = 0; i < opts.rounds; i++) {
      direct.push(await load(`http://${opts.address}:8088/`, undefined, opts.seconds, opts.connections));
      proxied.push(await load(`${opts.proxyUrl}/`, host, opts.seconds, opts.connections));
      reference.push(await load(ref.url, undefined, opts.seconds, opts.connections));
    }
  } finally {
    ref.stop();
  }
  await api.call('DELETE', `${base}/services/bench-www`);
  return { direct: mean(direct), proxied: mean(proxied), reference: mean(reference) };
}
