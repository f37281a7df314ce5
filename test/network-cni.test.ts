import t from 'tap';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { run } from '../core/command';
import { fillBusyboxRootfs } from '../workers/bases/busyboxRootfs';
import { CniNetwork } from '../workers/network/cni';
import { RuncRuntime } from '../workers/runtime/runc';

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const hostTag = crypto.randomBytes(3).toString('hex');
const dataDir = fs.mkdtempSync('/var/tmp/boxhost-cni-test-');
// A /16 of its own, away from podman's 10.88 and from other test hosts.
const boxSubnet = `10.${200 + crypto.randomInt(50)}.0.0/16`;
const timings: Record<string, number[]> = {};
const logger = {
  debug: (o: { ms?: number }, msg?: string) => o.ms !== undefined && msg && (timings[msg] ??= []).push(o.ms),
  info: () => undefined,
  warn: () => undefined,
};
const network = new CniNetwork({ dataDir, hostTag, boxSubnet, outbound: false, logger });
const runtime = new RuncRuntime({ dataDir, hostTag });
const P1 = { index: 1 };
const P2 = { index: 2 };
const servers: net.Server[] = [];
const boxes: { id: string; net: { index: number } }[] = [];

t.teardown(async () => {
  for (const s of servers) s.close();
  for (const b of boxes) await runtime.remove(b.id).catch(() => undefined);
  for (const b of boxes) await network.detach(b.id, b.net).catch(() => undefined);
  await network.destroyAll();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

async function startBox(id: string, netw: { index: number }) {
  boxes.push({ id, net: netw });
  const att = await network.attach(id, netw);
  const rootfs = path.join(dataDir, 'roots', id);
  fs.mkdirSync(rootfs, { recursive: true });
  await fillBusyboxRootfs(rootfs);
  fs.mkdirSync(path.join(rootfs, 'www'));
  fs.writeFileSync(path.join(rootfs, 'www/index.html'), `hello from ${id}\n`);
  await runtime.start({ boxId: id, hostname: id, rootfs, netnsPath: att.netnsPath, cpus: 1, ramMb: 64, environment: {}, mounts: [] });
  await runtime.exec(id, { command: ['httpd', '-f', '-p', '8080', '-h', '/www'], detach: true });
  await runtime.exec(id, { command: ['nc', '-ll', '-p', '9090', '-e', 'echo', `nc-${id}`], detach: true });
  return att;
}

function listen(host: string): Promise<net.Server> {
  return new Promise((resolve) => {
    const s = net.createServer((c) => c.end('host service\n'));
    servers.push(s);
    s.listen(0, host, () => resolve(s));
  });
}
const portOf = (s: net.Server) => (s.address() as net.AddressInfo).port;

/** From inside a box: fetch with wget (time-boxed: busybox wget -T crashes). */
const boxGet = (id: string, url: string) => runtime.exec(id, { command: ['timeout', '4', 'wget', '-q', '-O', '-', url], timeoutMs: 15_000 });
/** From inside a box: a TCP connection with nc; prints what the peer sends. */
const boxNc = (id: string, host: string, port: number) =>
  runtime.exec(id, { command: ['timeout', '4', 'nc', '-w', '3', host, String(port)], stdin: Buffer.alloc(0), timeoutMs: 15_000 });

function hostGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { timeout: 5000 }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(body));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

function hostConnect(host: string, port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = net.connect({ host, port, timeout: 3000 });
    let data = '';
    c.on('data', (d) => (data += d));
    c.on('end', () => resolve(data));
    c.on('timeout', () => c.destroy(new Error('timeout')));
    c.on('error', reject);
  });
}

t.test('naming', async (t) => {
  t.equal(network.bridgeName(7), `bh${hostTag.slice(0, 4)}p7`);
  t.ok(network.bridgeName(255).length <= 15);
  t.equal(network.subnet(3), boxSubnet.replace('.0.0/16', '.3.0/24'));
  t.equal(network.gateway(3), boxSubnet.replace('.0.0/16', '.3.1'));
  t.equal(network.netnsPath('abc'), `/run/netns/bh${hostTag}-abc`);
  t.throws(() => network.bridgeName(256));
  t.throws(() => network.netnsName('Bad_Id'));
});

t.test('init is idempotent and installs the chains', async (t) => {
  await network.init();
  await network.init();
  const rules = (await run(['iptables', '-w', '-S'])).stdout;
  t.match(rules, new RegExp(`-A INPUT -i bh${hostTag.slice(0, 4)}p\\+ -j BH-${hostTag}-IN`));
  t.equal(rules.split('\n').filter((l) => l === `-A INPUT -i bh${hostTag.slice(0, 4)}p+ -j BH-${hostTag}-IN`).length, 1, 'hooked once');
  t.match(rules, new RegExp(`-A BH-${hostTag}-FWD -m physdev --physdev-is-bridged -j ACCEPT`));
});

t.test('project networks', async (t) => {
  const a = await startBox('a', P1);
  const b = await startBox('b', P1);
  const c = await startBox('c', P2);
  t.equal(a.gateway, network.gateway(1));
  t.match(a.address, new RegExp(`^${network.subnet(1).replace('.0/24', '').replace(/\./g, '\\.')}\\.\\d+$`));
  t.match(c.address, new RegExp(`^${network.subnet(2).replace('.0/24', '').replace(/\./g, '\\.')}\\.\\d+$`));
  t.not(a.address, b.address);
  t.same(await network.attach('a', P1), a, 'attach is idempotent');
  t.same((await network.listAttached()).sort(), ['a', 'b', 'c']);

  // Listeners: httpd and nc in each box; two host services.
  const any = await listen('0.0.0.0');
  const local = await listen('127.0.0.1');
  await new Promise((r) => setTimeout(r, 300));

  t.test('loopback is up in a box', async (t) => {
    t.equal((await boxGet('a', 'http://127.0.0.1:8080/index.html')).stdout, 'hello from a\n');
  });

  t.test('boxes of one project reach each other', async (t) => {
    t.equal((await boxGet('b', `http://${a.address}:8080/index.html`)).stdout, 'hello from a\n', 'wget b → a');
    t.equal((await boxGet('a', `http://${b.address}:8080/index.html`)).stdout, 'hello from b\n', 'wget a → b');
    const nc = await boxNc('b', a.address, 9090);
    t.equal(nc.stdout, 'nc-a\n', 'nc b → a');
  });

  t.test('a box of another project cannot', async (t) => {
    const r = await boxGet('c', `http://${a.address}:8080/index.html`);
    t.not(r.exitCode, 0);
    t.equal(r.stdout, '');
    const nc = await boxNc('c', a.address, 9090);
    t.equal(nc.stdout, '', 'nc c → a gets nothing');
    const back = await boxGet('a', `http://${c.address}:8080/index.html`);
    t.equal(back.stdout, '', 'nor the other way');
  });

  t.test('a box cannot open connections to the host', async (t) => {
    // The services are there: the host itself reaches the 0.0.0.0 one on the gateway address.
    t.equal(await hostConnect(a.gateway, portOf(any)), 'host service\n', 'control: host → its own gateway address');
    t.equal(await hostConnect('127.0.0.1', portOf(local)), 'host service\n', 'control: host → 127.0.0.1');
    for (const [label, host, port] of [
      ['0.0.0.0 service via own gateway', a.gateway, portOf(any)],
      ['127.0.0.1 service via own gateway', a.gateway, portOf(local)],
      ['0.0.0.0 service via the other project gateway', c.gateway, portOf(any)],
      ['127.0.0.1 service via 127.0.0.1 (the box own loopback)', '127.0.0.1', portOf(local)],
    ] as [string, string, number][]) {
      const r = await boxNc('a', host, port);
      t.equal(r.stdout, '', `${label}: nothing`);
      t.not(r.exitCode, 0, `${label}: fails`);
    }
  });

  t.test('the host can connect into a box', async (t) => {
    t.equal(await hostGet(`http://${a.address}:8080/index.html`), 'hello from a\n');
    t.equal(await hostGet(`http://${c.address}:8080/index.html`), 'hello from c\n');
    t.equal(await hostConnect(b.address, 9090), 'nc-b\n');
  });

  t.test('detach frees the address and is idempotent', async (t) => {
    await runtime.remove('b');
    await network.detach('b', P1);
    await network.detach('b', P1);
    t.notOk(fs.existsSync(network.netnsPath('b')));
    const ipam = path.join(dataDir, 'cni', 'ipam', network.networkName(1));
    t.notOk(fs.existsSync(path.join(ipam, b.address)), 'address released');
    t.ok(fs.existsSync(path.join(ipam, a.address)), 'the others stay');
    t.same((await network.listAttached()).sort(), ['a', 'c']);
    // DEL after the netns is gone still frees the address.
    const d = await network.attach('d', P1);
    await run(['ip', 'netns', 'delete', network.netnsName('d')]);
    await network.detach('d', P1);
    t.notOk(fs.existsSync(path.join(ipam, d.address)), 'freed without its netns');
  });
});

t.test('CNI speed', async (t) => {
  const add: number[] = [];
  const del: number[] = [];
  timings['cni add'] = [];
  timings['cni del'] = [];
  for (let i = 0; i < 10; i++) {
    let t0 = Date.now();
    await network.attach(`speed${i}`, P2);
    add.push(Date.now() - t0);
    t0 = Date.now();
    await network.detach(`speed${i}`, P2);
    del.push(Date.now() - t0);
  }
  t.comment(`attach (netns + CNI ADD lo, eth0) median ${median(add)} ms; detach (CNI DEL + netns delete) median ${median(del)} ms`);
  t.comment(`CNI plugins alone: ADD (lo + bridge) median ${median(timings['cni add'])} ms; DEL + netns delete median ${median(timings['cni del'])} ms`);
  t.ok(median(add) < 5000);
});

t.test('destroyAll removes chains, bridges and netns', async (t) => {
  for (const b of boxes) await runtime.remove(b.id);
  await network.destroyAll();
  await network.destroyAll();
  t.same(await network.listAttached(), []);
  const rules = (await run(['iptables', '-w', '-S'])).stdout;
  t.notMatch(rules, `BH-${hostTag}`);
  const links = (await run(['ip', '-o', 'link', 'show'])).stdout;
  t.notMatch(links, network.bridgeName(1));
  t.notMatch(links, network.bridgeName(2));
});
