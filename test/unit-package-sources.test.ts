/**
 * What a base build's box may reach (docs/bases.md "Builds reach the package sources"): the http
 * Debian archives of the node's apt sources, through the node's proxy, by name. The proxy is run
 * for real on loopback against a real upstream HTTP server.
 */
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { PackageSources } from '../workers/bases/packageSources';
import { SourcesProxy } from '../workers/bases/sourcesProxy';
import { SourceRules } from '../workers/network/sourceRules';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-sources-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
const list = path.join(dir, 'sources.list');
fs.writeFileSync(
  list,
  [
    'deb http://deb.example.org/debian bookworm main',
    'deb https://security.example.org/debian-security bookworm-security main',
    'deb http://mirror.example.net:8080/debian bookworm-updates main contrib',
    'deb https://download.docker.com/linux/debian bookworm stable',
    'deb http://user:secret@private.example.org/debian bookworm main',
    'deb http://deb.example.org/debian trixie main',
    '',
  ].join('\n'),
);

t.test('only the http Debian archives of the recipe suites, with their ports', async (t) => {
  t.same(new PackageSources([list]).endpoints(), [
    { host: 'deb.example.org', port: 80 },
    { host: 'mirror.example.net', port: 8080 },
  ]);
});

/** One request through the proxy, as apt sends it (absolute-form URL), from `local`. */
function viaProxy(port: number, url: string, opts: { method?: string; local?: string } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: url, method: opts.method ?? 'GET', localAddress: opts.local, headers: { host: new URL(url).host } }, (res) => {
      let body = '';
      res.on('data', (b) => (body += b));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

t.test('the proxy: only boxes let in, only GET/HEAD of the sources by name, never a tunnel', async (t) => {
  const upstream = http.createServer((req, res) => res.end(`upstream ${req.method} ${req.headers.host} ${req.url}`));
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => upstream.close());
  const up = (upstream.address() as AddressInfo).port;
  const refused: string[] = [];
  const proxy = new SourcesProxy({ endpoints: () => [{ host: '127.0.0.1', port: up }], listenHost: '127.0.0.1', log: { warn: (_o, msg) => refused.push(msg) } });
  t.teardown(() => proxy.close());

  const port = await proxy.allow('box1', '127.0.0.2');
  t.equal(await proxy.allow('box1', '127.0.0.2'), port, 'one proxy, one port');
  const ok = await viaProxy(port, `http://127.0.0.1:${up}/debian/dists/bookworm/InRelease`, { local: '127.0.0.2' });
  t.same(ok, { status: 200, body: `upstream GET 127.0.0.1:${up} /debian/dists/bookworm/InRelease` }, 'a source, from a box let in: passed on');
  t.equal((await viaProxy(port, `http://127.0.0.1:${up}/x`, { local: '127.0.0.2', method: 'HEAD' })).status, 200, 'HEAD too');

  const stranger = await viaProxy(port, `http://127.0.0.1:${up}/x`, { local: '127.0.0.3' }).catch((e: Error) => e.message);
  t.equal(stranger, 'socket hang up', 'a box not let in: cut without an answer');
  const cases: [string, Promise<{ status: number; body: string }>][] = [
    ['another port of the source host', viaProxy(port, `http://127.0.0.1:${port}/x`, { local: '127.0.0.2' })],
    ['another host', viaProxy(port, 'http://example.org/x', { local: '127.0.0.2' })],
    ['POST', viaProxy(port, `http://127.0.0.1:${up}/x`, { local: '127.0.0.2', method: 'POST' })],
  ];
  for (const [what, p] of cases) {
    const r = await p;
    t.equal(r.status, 403, `${what}: 403`);
    t.match(r.body, /^boxhost: /);
  }

  // CONNECT (what https_proxy sends): refused, even to a source.
  const tunnel = await new Promise<string>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' }, () => s.write(`CONNECT 127.0.0.1:${up} HTTP/1.1\r\nHost: 127.0.0.1:${up}\r\n\r\n`));
    let got = '';
    s.on('data', (b) => (got += b));
    s.on('close', () => resolve(got));
    s.on('error', () => resolve(got));
  });
  t.match(tunnel, /^HTTP\/1\.1 403/, 'CONNECT: 403');
  t.ok(refused.length >= 4, 'each refusal is told');

  proxy.disallow('box1');
  t.equal(await viaProxy(port, `http://127.0.0.1:${up}/x`, { local: '127.0.0.2' }).catch((e: Error) => e.message), 'socket hang up', 'let go: cut again');
});

t.test('an upstream that fails is a 502, not a hang', async (t) => {
  const dead = net.createServer();
  await new Promise<void>((r) => dead.listen(0, '127.0.0.1', () => r()));
  const gone = (dead.address() as AddressInfo).port;
  await new Promise<void>((r) => dead.close(() => r()));
  const proxy = new SourcesProxy({ endpoints: () => [{ host: '127.0.0.1', port: gone }], listenHost: '127.0.0.1' });
  t.teardown(() => proxy.close());
  const port = await proxy.allow('b', '127.0.0.1');
  t.equal((await viaProxy(port, `http://127.0.0.1:${gone}/x`)).status, 502);
});

t.test('a source resolving to a refused destination is never connected to; a body is refused', async (t) => {
  let hits = 0;
  const upstream = http.createServer((_req, res) => {
    hits++;
    res.end('reached');
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => upstream.close());
  const up = (upstream.address() as AddressInfo).port;
  const proxy = new SourcesProxy({ endpoints: () => [{ host: 'localhost', port: up }], refused: async () => ['127.0.0.0/8'], listenHost: '127.0.0.1' });
  t.teardown(() => proxy.close());
  const port = await proxy.allow('b', '127.0.0.1');
  t.equal((await viaProxy(port, `http://localhost:${up}/x`)).status, 502, 'refused destination: 502');
  t.equal(hits, 0, 'and nothing reached it');
  const open = new SourcesProxy({ endpoints: () => [{ host: 'localhost', port: up }], listenHost: '127.0.0.1' });
  t.teardown(() => open.close());
  const p2 = await open.allow('b', '127.0.0.1');
  t.equal((await viaProxy(p2, `http://localhost:${up}/x`)).status, 200, 'control: the same source, not refused, is reached');
  // A GET with a chunked body (a second request smuggled inside it) is refused whole.
  const smuggled = await new Promise<string>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port: p2 }, () =>
      s.write(`GET http://localhost:${up}/x HTTP/1.1\r\nHost: localhost:${up}\r\nTransfer-Encoding: chunked\r\n\r\n2a\r\nPOST /steal HTTP/1.1\r\nHost: other.example\r\n\r\n\r\n0\r\n\r\n`),
    );
    let got = '';
    s.on('data', (b) => (got += b));
    s.on('close', () => resolve(got));
    s.on('error', () => resolve(got));
  });
  t.match(smuggled, /^HTTP\/1\.1 403/, 'a request with a body: 403');
  t.equal(hits, 1, 'only the control reached the source');
});

t.test('a peer never let in is cut at once; a CONNECT that resets does not take the process down', async (t) => {
  const proxy = new SourcesProxy({ endpoints: () => [], listenHost: '127.0.0.1' });
  t.teardown(() => proxy.close());
  const port = await proxy.allow('b', '127.0.0.2');
  const cut = await new Promise<string>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: '127.0.0.3' }, () => s.write('GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n'));
    let got = '';
    s.on('data', (b) => (got += b));
    s.on('close', () => resolve(`closed:${got}`));
    s.on('error', () => resolve(`closed:${got}`));
  });
  t.equal(cut, 'closed:', 'no answer at all to a stranger');
  await new Promise<void>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' }, () => {
      s.write('CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n');
      s.resetAndDestroy();
      resolve();
    });
    s.on('error', () => resolve());
  });
  await new Promise((r) => setTimeout(r, 300));
  t.pass('the process lives on');
});

t.test('a box has at most 32 requests at once: the 33rd is told 429, the others are served', async (t) => {
  const held: http.ServerResponse[] = [];
  let holding = true;
  let arrived = 0;
  const upstream = http.createServer((_req, res) => {
    arrived++;
    if (holding) held.push(res);
    else res.end('ok');
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => upstream.close());
  const up = (upstream.address() as AddressInfo).port;
  const proxy = new SourcesProxy({ endpoints: () => [{ host: '127.0.0.1', port: up }], listenHost: '127.0.0.1' });
  t.teardown(() => proxy.close());
  const port = await proxy.allow('b', '127.0.0.1');
  const first = Array.from({ length: 32 }, (_, i) => viaProxy(port, `http://127.0.0.1:${up}/f${i}`));
  while (arrived < 32) await new Promise((r) => setTimeout(r, 20));
  t.equal((await viaProxy(port, `http://127.0.0.1:${up}/one-more`)).status, 429, 'past the cap: 429');
  holding = false;
  for (const res of held) res.end('ok');
  t.same([...new Set((await Promise.all(first)).map((r) => r.status))], [200], 'the 32 held ones are served');
  t.equal((await viaProxy(port, `http://127.0.0.1:${up}/again`)).status, 200, 'and once they are done, the next one is too');
});

t.test('a rule names its box, so closing one box never touches another', async (t) => {
  t.same(SourceRules.match('10.88.0.5', '10.88.0.1', 4321, 'abc123'), ['-s', '10.88.0.5/32', '-d', '10.88.0.1/32', '-p', 'tcp', '-m', 'tcp', '--dport', '4321', '-m', 'comment', '--comment', 'bhbox-abc123']);
  const rules = new SourceRules(async () => 'iptables', 'PKG');
  await t.rejects(rules.open('abc123', '10.88.0.5; rm', '10.88.0.1', 80), /invalid box address/);
  await t.rejects(rules.open('abc123', '10.88.0.5', '10.88.0.1', 70000), /invalid proxy port/);
});
