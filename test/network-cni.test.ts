import './helpers/childEnv'; // first: its Node children start without tap's hook (plainEnv alone does not keep it out)
import t from 'tap';
import { spawn, ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import dgram from 'node:dgram';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { run, sleep } from '../core/command';
import { useSpawner } from '../core/spawner';
import { fillBusyboxRootfs } from '../workers/bases/busyboxRootfs';
import { formatIpv4, parseIpv4 } from '../core/netblocks';
import { CniNetwork } from '../workers/network/cni';
import { canonicalCidr } from '../workers/network/firewall';
import { RuncRuntime } from '../workers/runtime/runc';
import { platformDestinations } from '../workers/setup';
import { claimDir } from './helpers/owner';
import { elementVeth, guardSets } from './helpers/hostState';
import { ConfigError, type Config } from '../core/config';

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const hostTag = crypto.randomBytes(3).toString('hex');
const dataDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-test-${hostTag}-`));
// A /16 of its own, away from podman's 10.88 and from other test hosts.
const boxSubnet = `10.${200 + crypto.randomInt(50)}.0.0/16`;
const timings: Record<string, number[]> = {};
/** Every message the driver logged (init's rewrites among them). */
const logged: string[] = [];
const logger = {
  debug: (o: { ms?: number }, msg?: string) => {
    if (msg) logged.push(msg);
    if (o.ms !== undefined && msg) (timings[msg] ??= []).push(o.ms);
  },
  info: (_o: object, msg?: string) => msg && logged.push(msg),
  warn: (_o: object, msg?: string) => msg && logged.push(msg),
};
// The default layout: a /22 per project.
const network = new CniNetwork({ dataDir, hostTag, boxSubnet, outbound: false, logger });
// As on a node: host commands and the port guard's elements through the helper (core/spawner.ts).
useSpawner(true);
t.teardown(() => useSpawner(false));
/** The mask of a box's eth0: its project block's. */
const PFX = network.layout.projectPrefix;
const runtime = new RuncRuntime({ dataDir, hostTag });
const P1 = { index: 1 };
const P2 = { index: 2 };
const servers: net.Server[] = [];
const boxes: { id: string; net: { index: number } }[] = [];
/** Helper processes this test started (listeners inside netns). */
const children: ChildProcess[] = [];
/** Undo steps of the outbound test's fake outside world (run even when it fails). */
const undo: (() => Promise<unknown>)[] = [];

t.teardown(async () => {
  for (const c of children) c.kill('SIGKILL');
  for (const u of undo.reverse()) await u().catch(() => undefined);
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

/** The environment of helper processes: without tap's NODE_OPTIONS (a loader of its own). */
const plainEnv = (): NodeJS.ProcessEnv => ({ PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' });

/** Runs a host command inside a netns, as the host (root, all capabilities) can. */
const inNs = (ns: string, argv: string[]) => run(['ip', 'netns', 'exec', ns, ...argv], { allowFailure: true, timeoutMs: 15_000, env: plainEnv() });
const inBox = (id: string, argv: string[], netw = network) => inNs(netw.netnsName(id), argv);
/** Runs `ip` commands in a box's netns and fails the test on an error. */
async function ipIn(id: string, ...cmds: string[][]) {
  for (const c of cmds) {
    const r = await inBox(id, ['ip', ...c]);
    if (r.exitCode !== 0) throw new Error(`ip ${c.join(' ')} in ${id}: ${r.stderr}`);
  }
}

/** A netns-only box (no container): enough for the network, and it lets the test act as root
 *  inside it, which a real box cannot. */
async function bareBox(id: string, netw: { index: number }) {
  boxes.push({ id, net: netw });
  const att = await network.attach(id, netw);
  const link = JSON.parse((await inBox(id, ['ip', '-j', 'link', 'show', 'dev', 'eth0'])).stdout)[0] as { address: string; link_index: number };
  const veth = (JSON.parse((await run(['ip', '-j', 'link', 'show', 'type', 'veth'])).stdout) as { ifindex: number; ifname: string }[]).find((l) => l.ifindex === link.link_index)!.ifname;
  return { ...att, id, mac: link.address, veth };
}

const UDP_SERVER = `const s = require('dgram').createSocket('udp4');
s.on('message', (m, r) => console.log(r.address + ' ' + m));
s.bind(Number(process.argv[1]), () => console.log('ready'));`;
const UDP_SEND = `const s = require('dgram').createSocket('udp4');
const [h, p, m] = process.argv.slice(1);
s.send(m, Number(p), h, (e) => { if (e) { console.error(e.code); process.exitCode = 1; } s.close(); });`;
const TCP_SERVER = `require('net').createServer((c) => c.end('outside ' + c.localAddress + ' from ' + c.remoteAddress + '\\n')).listen(Number(process.argv[1]), '0.0.0.0', () => console.log('ready'));`;
/** Connects and prints what the peer sent, or the error code (EHOSTUNREACH for a REJECT). */
const TCP_PROBE = `const c = require('net').connect({ host: process.argv[1], port: Number(process.argv[2]), timeout: 3000 });
let d = ''; c.on('data', (x) => (d += x)); c.on('end', () => console.log(d.trim()));
c.on('timeout', () => { console.log('ETIMEDOUT'); c.destroy(); }); c.on('error', (e) => console.log(e.code));`;

/** A node process inside a netns, started by this test: resolves once it printed `ready`,
 *  then keeps every further line. */
async function nsProcess(ns: string, script: string, ...args: string[]) {
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', script, ...args], { stdio: ['ignore', 'pipe', 'inherit'], env: plainEnv() });
  children.push(child);
  const lines: string[] = [];
  let buf = '';
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === 'ready') resolve();
        else lines.push(line);
      }
    });
    child.on('exit', (code) => reject(new Error(`${script.slice(0, 40)}… in ${ns} exited ${code}`)));
  });
  return lines;
}

/** A UDP listener in a box's netns: `got(payload)` answers the sender address of a datagram
 *  carrying it, or null when none came within `ms`. */
async function udpListener(id: string, port: number) {
  const lines = await nsProcess(network.netnsName(id), UDP_SERVER, String(port));
  return {
    async got(payload: string, ms: number): Promise<string | null> {
      const end = Date.now() + ms;
      for (;;) {
        const l = lines.find((x) => x.endsWith(` ${payload}`));
        if (l) return l.split(' ')[0];
        if (Date.now() > end) return null;
        await sleep(50);
      }
    },
  };
}

/** Sends one datagram from inside a box's netns. */
async function udpFrom(id: string, host: string, port: number, payload: string) {
  const r = await inBox(id, [process.execPath, '-e', UDP_SEND, host, String(port), payload]);
  if (r.exitCode !== 0) throw new Error(`udp send from ${id}: ${r.stderr}`);
}

/** The MAC a netns (or the host, with ns null) has for `ip` on `dev`, whatever its state. */
async function neighMac(ns: string | null, ip: string, dev: string): Promise<string | null> {
  const argv = ['ip', '-j', 'neigh', 'show', ip, 'dev', dev];
  const r = ns ? await inNs(ns, argv) : await run(argv);
  const [n] = JSON.parse(r.stdout || '[]') as { lladdr?: string }[];
  return n?.lladdr ?? null;
}
/** Sets a neighbour entry STALE, so that an ARP packet about `ip` would update it. */
async function setNeigh(ns: string | null, ip: string, mac: string, dev: string) {
  const argv = ['ip', 'neigh', 'replace', ip, 'lladdr', mac, 'dev', dev, 'nud', 'stale'];
  if (ns) await inNs(ns, argv);
  else await run(argv);
}
/** Gratuitous ARP from a box claiming `ip` (the box must hold it on eth0). */
const garp = (id: string, ip: string) => inBox(id, ['busybox', 'arping', '-U', '-c', '1', '-w', '1', '-I', 'eth0', '-s', ip, ip]);

const iptablesS = async (chain: string) => (await run(['iptables', '-w', '-S', chain], { allowFailure: true })).stdout;
const bridgeRuleset = async () => (await run(['nft', 'list', 'ruleset', 'bridge'])).stdout;
/** The port guard's elements keyed on `veth`, by set ("ports", "macs: <mac>", "addrs: <ip>"). */
const guardOf = async (veth: string) => {
  const sets = await guardSets({ hostTag } as Config);
  const out: string[] = [];
  for (const [name, elems] of sets) for (const e of elems) if (elementVeth(e) === veth) out.push(typeof e === 'string' ? name : `${name}: ${(e as { concat: unknown[] }).concat[1]}`);
  return out.sort();
};
/** Element veths of the port guard that are no link on the host (left behind). */
const staleGuards = async () => {
  const sets = await guardSets({ hostTag } as Config);
  return [...new Set([...sets.values()].flat().map(elementVeth))].filter((v): v is string => !!v && !fs.existsSync(`/sys/class/net/${v}`));
};

t.test('naming', async (t) => {
  t.equal(network.bridgeName(7), `bh${hostTag.slice(0, 4)}p7`);
  t.ok(network.bridgeName(63).length <= 15);
  t.equal(network.subnet(3), boxSubnet.replace('.0.0/16', '.12.0/22'));
  t.equal(network.gateway(3), boxSubnet.replace('.0.0/16', '.12.1'));
  t.equal(network.netnsPath('abc'), `/run/netns/bh${hostTag}-abc`);
  t.throws(() => network.bridgeName(64), /0…63/, 'a /16 holds 64 projects of /22');
  t.throws(() => network.netnsName('Bad_Id'));
});

t.test('init is idempotent and installs the chains', async (t) => {
  await network.init();
  await network.init();
  const rules = (await run(['iptables', '-w', '-S'])).stdout;
  t.match(rules, new RegExp(`-A INPUT -i bh${hostTag.slice(0, 4)}p\\+ -j BH-${hostTag}-IN`));
  t.equal(rules.split('\n').filter((l) => l === `-A INPUT -i bh${hostTag.slice(0, 4)}p+ -j BH-${hostTag}-IN`).length, 1, 'hooked once');
  t.match(rules, new RegExp(`-A BH-${hostTag}-FWD -m physdev --physdev-is-bridged -j ACCEPT`));
  const br = `${network.bridgePrefix}+`;
  t.match(await iptablesS(network.chains.chainIn), `-A BH-${hostTag}-IN -j BH-${hostTag}-SRC\n`, 'INPUT checks sources first');
  t.match(await iptablesS(network.chains.chainFwd), `-A BH-${hostTag}-FWD -i ${br} -j BH-${hostTag}-SRC\n`, 'FORWARD checks sources first');
  t.notMatch(rules, `BH-${hostTag}-OUT`, 'no outbound chain without outbound');
  t.match(await bridgeRuleset(), new RegExp(`table bridge ${network.portTable} \\{[^]*set macs \\{[^]*iifname != @ports accept`), 'port guard table');
  logged.length = 0;
  const t0 = Date.now();
  await network.init();
  t.same(logged.filter((m) => /written|restored|removed/.test(m)), [], 'a third init rewrites nothing');
  t.comment(`init on a set-up host: ${Date.now() - t0} ms`);
});

t.test('project networks', async (t) => {
  const a = await startBox('a', P1);
  const b = await startBox('b', P1);
  const c = await startBox('c', P2);
  t.equal(a.gateway, network.gateway(1));
  t.ok(network.layout.holds(1, a.address), `${a.address} is in project 1's ${network.subnet(1)}`);
  t.ok(network.layout.holds(2, c.address), `${c.address} is in project 2's ${network.subnet(2)}`);
  t.not(a.address, b.address);
  t.same(await network.attach('a', P1), a, 'attach is idempotent');
  // Root in a box owns its netns and may take lo down; the netns outlives a stop.
  await inNs(network.netnsName('a'), ['ip', 'link', 'set', 'lo', 'down']);
  t.same(await network.attach('a', P1, { loopbackUp: true }), a, 'lo taken down inside: attach keeps eth0 and the address');
  t.match((await inNs(network.netnsName('a'), ['ip', '-j', 'link', 'show', 'dev', 'lo'])).stdout, /"UP"/, 'and brings lo up again, whatever made the netns');
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

  t.test("the helper wires a box as the CNI plugins do (the fallback), and each frees the other's lease", async (t) => {
    const ipam = path.join(dataDir, 'cni', 'ipam', network.networkName(1));
    /** What a box's wiring looks like, without what differs from box to box. */
    const wiring = async (box: { id: string; veth: string; address: string }) => {
      const addr = JSON.parse((await inBox(box.id, ['ip', '-j', 'addr', 'show', 'dev', 'eth0'])).stdout)[0];
      const v4 = addr.addr_info.find((i: { family: string }) => i.family === 'inet');
      const routes = JSON.parse((await inBox(box.id, ['ip', '-j', 'route', 'show'])).stdout) as { dst: string; gateway?: string; dev: string }[];
      const host = JSON.parse((await run(['ip', '-j', 'link', 'show', 'dev', box.veth])).stdout)[0];
      return {
        eth0: { up: addr.flags.includes('UP'), mtu: addr.mtu, prefixlen: v4.prefixlen, local: v4.local === box.address, broadcast: v4.broadcast },
        routes: routes.map((r) => `${r.dst} ${r.gateway ?? ''} ${r.dev}`).sort(),
        hostEnd: { master: host.master, up: host.operstate, mtu: host.mtu },
        lease: fs.readFileSync(path.join(ipam, box.address), 'utf8').replace(network.netnsName(box.id), '<cid>'),
        guard: (await guardOf(box.veth)).length,
        arpNotify: (await inBox(box.id, ['cat', '/proc/sys/net/ipv4/conf/eth0/arp_notify'])).stdout.trim(),
      };
    };
    const byHelper = await bareBox('e1', P1);
    useSpawner(false);
    const byPlugin = await bareBox('e2', P1).finally(() => useSpawner(true));
    const helperWiring = await wiring(byHelper);
    t.same(helperWiring, await wiring(byPlugin), 'the same eth0, routes, bridge port, lease and guard');
    t.match(helperWiring, { eth0: { up: true, prefixlen: PFX }, hostEnd: { master: network.bridgeName(1), up: 'UP' }, lease: '<cid>\r\neth0', guard: 3, arpNotify: '1' });
    t.ok(network.layout.holds(1, byHelper.address) && network.layout.holds(1, byPlugin.address), 'addresses of the block');
    // Freed across: the helper frees the plugin's lease and wiring, and the plugin the helper's.
    await network.detach('e2', P1);
    useSpawner(false);
    await network.detach('e1', P1).finally(() => useSpawner(true));
    for (const b of [byHelper, byPlugin]) {
      t.notOk(fs.existsSync(path.join(ipam, b.address)), `${b.id}: lease freed`);
      t.notOk(fs.existsSync(`/sys/class/net/${b.veth}`), `${b.id}: veth gone`);
    }
  });
});

t.test('spoofing on the bridge', async (t) => {
  const P3 = { index: 3 };
  const v = await bareBox('v', P3); // the neighbour whose identity is stolen
  const w = await bareBox('w', P3); // the one the traffic is aimed at
  const x = await bareBox('x', P3); // steals addresses
  const y = await bareBox('y', P3); // steals MACs
  const z = await bareBox('z', P3); // loses its port guard
  const bridge = network.bridgeName(3);
  const gwMac = JSON.parse((await run(['ip', '-j', 'link', 'show', 'dev', bridge])).stdout)[0].address as string;
  const atW = await udpListener('w', 5000);
  const atV = await udpListener('v', 5000);
  const nsOf = (id: string) => network.netnsName(id);
  /** w's MAC pinned in an attacker's netns: its own ARP would give it away before its packets. */
  const staticW = ['neigh', 'replace', w.address, 'lladdr', w.mac, 'dev', 'eth0', 'nud', 'permanent'];

  t.test('the port guards are in place (the plugin\'s macspoofchk is not needed)', async (t) => {
    const rs = await bridgeRuleset();
    t.notMatch(rs, 'cni-br-iface-', "no macspoofchk of the plugin's: the port guard checks the box's MAC");
    t.same(await guardOf(x.veth), ['addrs: ' + x.address, 'macs: ' + x.mac, 'ports'].sort(), "x's veth: guarded, with its MAC and address");
    for (const rule of ['iifname != @ports accept', 'iifname . ether saddr != @macs drop', 'ether type != { ip, arp } drop', 'iifname . arp saddr ether != @macs drop', 'iifname . arp saddr ip != @addrs drop', 'iifname . ip saddr != @addrs drop']) {
      t.ok(rs.includes(rule), `the guard's chain: ${rule}`);
    }
    t.match(await iptablesS(network.chains.chainSrc), `-A BH-${hostTag}-SRC ! -s ${network.subnet(3)} -i ${bridge} -j DROP`, 'per-bridge source rule');
    t.equal(fs.readFileSync(`/proc/sys/net/ipv4/conf/${bridge}/rp_filter`, 'utf8').trim(), '1', 'rp_filter=1 on the bridge');
  });

  t.test('a box cannot use a neighbour address nor answer ARP for it or for the gateway', async (t) => {
    // Controls: with its own identity, x's datagrams and gratuitous ARP reach w and the host.
    await udpFrom('x', w.address, 5000, 'x-own');
    t.equal(await atW.got('x-own', 3000), x.address, 'control: x → w arrives');
    await setNeigh(null, x.address, '02:00:00:00:00:99', bridge);
    await setNeigh(nsOf('w'), x.address, '02:00:00:00:00:99', 'eth0');
    await sleep(1100); // past the neighbour entries' locktime
    await garp('x', x.address);
    t.equal(await neighMac(null, x.address, bridge), x.mac, "control: x's gratuitous ARP updates the host's entry");
    t.equal(await neighMac(nsOf('w'), x.address, 'eth0'), x.mac, "control: and w's");

    // The attack: x takes v's address (and the gateway's), and says so.
    await setNeigh(null, v.address, v.mac, bridge);
    await setNeigh(nsOf('w'), v.address, v.mac, 'eth0');
    await setNeigh(nsOf('v'), w.gateway, gwMac, 'eth0');
    await sleep(1100);
    // (The static entry for w after the addresses: removing the last address flushes them.)
    await ipIn('x', ['addr', 'flush', 'dev', 'eth0'], ['addr', 'add', `${v.address}/${PFX}`, 'dev', 'eth0'], ['addr', 'add', `${w.gateway}/32`, 'dev', 'eth0'], staticW);
    await udpFrom('x', w.address, 5000, 'x-as-v');
    await garp('x', v.address);
    await garp('x', w.gateway);
    t.equal(await atW.got('x-as-v', 1500), null, "a datagram from v's address does not reach w");
    t.equal(await neighMac(null, v.address, bridge), v.mac, "the host's entry for v is not poisoned");
    t.equal(await neighMac(nsOf('w'), v.address, 'eth0'), v.mac, "w's entry for v is not poisoned");
    t.equal(await neighMac(nsOf('v'), w.gateway, 'eth0'), gwMac, "v's entry for the gateway is not poisoned");
  });

  t.test("a box cannot use a neighbour's MAC", async (t) => {
    await udpFrom('y', w.address, 5000, 'y-own');
    t.equal(await atW.got('y-own', 3000), y.address, 'control: y → w arrives');
    await udpFrom('v', w.address, 5000, 'v-own');
    t.equal(await atW.got('v-own', 3000), v.address, "control: v → w arrives (the bridge learns v's MAC on v's port)");

    await ipIn('y', ['link', 'set', 'dev', 'eth0', 'down'], ['link', 'set', 'dev', 'eth0', 'address', v.mac], ['link', 'set', 'dev', 'eth0', 'up'], staticW);
    for (let i = 0; i < 3; i++) await udpFrom('y', w.address, 5000, `y-as-v-${i}`);
    t.equal(await atW.got('y-as-v-2', 1500), null, "a frame with v's MAC does not reach w");
    const fdb = JSON.parse((await run(['bridge', '-j', 'fdb', 'show', 'br', bridge])).stdout) as { mac: string; ifname: string }[];
    t.same(fdb.filter((e) => e.mac === v.mac).map((e) => e.ifname), [v.veth], "the bridge still has v's MAC on v's port");
    const sock = dgram.createSocket('udp4');
    await new Promise<void>((resolve, reject) => sock.send('host-to-v', 5000, v.address, (e) => (e ? reject(e) : resolve())));
    sock.close();
    t.equal(await atV.got('host-to-v', 3000), v.gateway, 'traffic for v still reaches v');
  });

  t.test("a port without its guard: the bridge's source rule holds, and init puts the guard back", async (t) => {
    // As a box attached by an older version: not among the guarded ports.
    await run(['nft', 'delete', 'element', 'bridge', network.portTable, 'ports', `{ "${z.veth}" }`]);
    // Within the project's block only the port guard could tell: without it, it passes.
    await ipIn('z', ['addr', 'flush', 'dev', 'eth0'], ['addr', 'add', `${v.address}/${PFX}`, 'dev', 'eth0'], staticW);
    await udpFrom('z', w.address, 5000, 'z-as-v');
    t.equal(await atW.got('z-as-v', 3000), v.address, 'control: without its guard, z can pass as v');
    // Another project's address: the per-bridge rule drops it.
    const counter = async () => {
      const out = (await run(['iptables', '-w', '-L', network.chains.chainSrc, '-v', '-x', '-n'])).stdout;
      const line = out.split('\n').find((l) => l.includes(bridge));
      return Number(line?.trim().split(/\s+/)[0] ?? NaN);
    };
    const before = await counter();
    const foreign = formatIpv4(parseIpv4(network.layout.block(1).network)! + 77);
    await ipIn('z', ['addr', 'flush', 'dev', 'eth0'], ['addr', 'add', `${foreign}/${PFX}`, 'dev', 'eth0'], ['route', 'add', `${w.address}/32`, 'dev', 'eth0'], staticW);
    await udpFrom('z', w.address, 5000, 'z-as-p1');
    t.equal(await atW.got('z-as-p1', 1500), null, "an address of another project does not reach w");
    t.ok((await counter()) > before, 'dropped by the per-bridge source rule');

    // Back to its own address; init restores the guard (address from its lease, not eth0),
    // here through `nft` itself (the fallback when the node's helper is off).
    await ipIn('z', ['addr', 'flush', 'dev', 'eth0'], ['addr', 'add', `${z.address}/${PFX}`, 'dev', 'eth0']);
    logged.length = 0;
    useSpawner(false);
    await network.init().finally(() => useSpawner(true));
    t.same(logged.filter((m) => m === 'port guard restored'), ['port guard restored'], "init restored z's guard, only z's");
    t.same(await guardOf(z.veth), ['addrs: ' + z.address, 'macs: ' + z.mac, 'ports'].sort(), 'all three of its elements');
    await ipIn('z', ['addr', 'flush', 'dev', 'eth0'], ['addr', 'add', `${v.address}/${PFX}`, 'dev', 'eth0'], staticW);
    await udpFrom('z', w.address, 5000, 'z-as-v-again');
    t.equal(await atW.got('z-as-v-again', 1500), null, 'with its guard back, z cannot pass as v');
  });

  t.test('a table of another layout is replaced in one transaction with every port it held and every attached box', async (t) => {
    // w's elements gone (as a box attached by an older version), the chain of another layout.
    await run(['nft', '-f', '-'], { input: ['ports', 'macs', 'addrs'].map((set) => `delete element bridge ${network.portTable} ${set} { ${set === 'ports' ? `"${w.veth}"` : `"${w.veth}" . ${set === 'macs' ? w.mac : w.address}`} }`).join('\n') + '\n' });
    await run(['nft', 'flush', 'chain', 'bridge', network.portTable, 'prerouting']);
    await run(['nft', 'add', 'rule', 'bridge', network.portTable, 'prerouting', 'accept', 'comment', '"boxhost port guard v1"']);
    t.same(await guardOf(w.veth), [], 'control: w is not guarded');
    logged.length = 0;
    await network.init();
    t.ok(logged.includes('port guard table written'), 'the table was written anew');
    t.same(logged.filter((m) => m === 'port guard restored'), [], 'no box needed its guard back after: each was in the write');
    for (const [id, port] of [['v', v], ['w', w], ['x', x], ['y', y], ['z', z]] as const) {
      t.same(await guardOf(port.veth), ['addrs: ' + port.address, 'macs: ' + port.mac, 'ports'].sort(), `${id}: all three of its elements`);
    }
    t.ok((await bridgeRuleset()).includes('iifname . ip saddr != @addrs drop'), "the guard's rules are this layout's");
    // z still has v's address from the test above: still refused.
    await udpFrom('z', w.address, 5000, 'z-as-v-relayout');
    t.equal(await atW.got('z-as-v-relayout', 1500), null, 'z cannot pass as v under the rewritten table');
  });

  t.test('detach removes the port guard and the macspoofchk rules, netns or not', async (t) => {
    await network.detach('x', P3);
    await run(['ip', 'netns', 'delete', nsOf('y')]);
    await network.detach('y', P3);
    const rs = await bridgeRuleset();
    for (const [id, port] of [['x', x], ['y', y]] as const) {
      t.same(await guardOf(port.veth), [], `${id}: no guard elements`);
      t.notMatch(rs, `${nsOf(id)}-eth0`, `${id}: no macspoofchk chain`);
    }
    t.equal((await guardOf(v.veth)).length, 3, 'the others stay');
    t.same(await staleGuards(), [], 'no element of a veth that is gone');
  });

  t.test('an older mark (address and veth, no MAC) still has its guard dropped at detach', async (t) => {
    const mark = path.join(dataDir, 'cni', 'attached', 'v');
    fs.writeFileSync(mark, `${v.address}\n${v.veth}\n`);
    // Through `nft` itself (the helper off), whose delete must name each element.
    useSpawner(false);
    await network.detach('v', P3).finally(() => useSpawner(true));
    t.same(await guardOf(v.veth), [], 'v: no guard elements');
    t.same(await staleGuards(), [], 'none left');
  });
});

t.test('releaseProject removes the bridge, its rule and its IPAM state with the last box', async (t) => {
  const P4 = { index: 4 };
  const bridge = network.bridgeName(4);
  const ipam = path.join(dataDir, 'cni', 'ipam', network.networkName(4));
  const rule = `-A BH-${hostTag}-SRC ! -s ${network.subnet(4)} -i ${bridge} -j DROP`;
  await bareBox('r1', P4);
  await bareBox('r2', P4);
  t.equal(await network.releaseProject(P4), false, 'two boxes on it: kept');
  await network.detach('r1', P4);
  t.equal(await network.releaseProject(P4), false, 'one box on it: kept');
  t.ok(fs.existsSync(`/sys/class/net/${bridge}`), 'the bridge is there');
  t.match(await iptablesS(network.chains.chainSrc), rule);
  await network.detach('r2', P4);
  t.equal(await network.releaseProject(P4), true, 'the last box gone: released');
  t.notOk(fs.existsSync(`/sys/class/net/${bridge}`), 'bridge removed');
  t.notOk(fs.existsSync(ipam), 'IPAM state removed');
  t.notMatch(await iptablesS(network.chains.chainSrc), rule, 'source rule removed');
  t.same(await staleGuards(), [], 'no port guards left');
  t.equal(await network.releaseProject(P4), true, 'idempotent');

  // A box joining while the previous last box leaves: it always ends on a live bridge.
  const P5 = { index: 5 };
  const bridge5 = network.bridgeName(5);
  await bareBox('q0', P5);
  let retried = 0;
  for (let i = 0; i < 6; i++) {
    const next = `q${i + 1}`;
    boxes.push({ id: next, net: P5 });
    const join = async () => {
      for (let n = 0; ; n++) {
        try {
          return await network.attach(next, P5);
        } catch (e) {
          if (n >= 5 || !/released/.test(String(e))) throw e;
          retried++;
          await sleep(50);
        }
      }
    };
    await Promise.all([network.detach(`q${i}`, P5).then(() => network.releaseProject(P5)), join()]);
    const link = JSON.parse((await inBox(next, ['ip', '-j', 'link', 'show', 'dev', 'eth0'])).stdout)[0] as { link_index: number };
    const ports = JSON.parse((await run(['ip', '-j', 'link', 'show', 'master', bridge5], { allowFailure: true })).stdout || '[]') as { ifindex: number }[];
    t.ok(ports.some((p) => p.ifindex === link.link_index), `${next} is on the live bridge`);
  }
  t.comment(`attaches retried because a release was under way: ${retried}`);

  // The same, made certain: a release under way (its mark) when the veth has joined.
  const mark = path.join(dataDir, 'cni', 'releasing', `5-${process.pid}-test`);
  fs.mkdirSync(path.dirname(mark), { recursive: true });
  fs.writeFileSync(mark, '');
  boxes.push({ id: 'q7', net: P5 });
  await t.rejects(network.attach('q7', P5), /released/, 'an attach that sees a release under way fails');
  t.same(await staleGuards(), [], 'and leaves no port guard');
  t.notOk(fs.readdirSync(path.join(dataDir, 'cni', 'ipam', network.networkName(5))).some((f) => fs.readFileSync(path.join(dataDir, 'cni', 'ipam', network.networkName(5), f), 'utf8').includes(network.netnsName('q7'))), 'nor a lease');
  fs.rmSync(mark);
  t.match((await network.attach('q7', P5)).address, /\d+$/, 'its retry joins');
  await network.detach('q6', P5);
  await network.detach('q7', P5);
  t.equal(await network.releaseProject(P5), true);
});

/**
 * The "outside": a netns behind a veth, routed to only for one test bridge (a policy rule on its
 * input interface, whose table ends in `unreachable`): nothing leaves the machine, and the
 * host's own routes (its real metadata service among them) are untouched. A TCP server on port
 * 7000 answers on every address in `addresses`. Undone by `undo`.
 */
async function outsideWorld(tag: string, bridge: string, transit: (n: number) => string, addresses: string[]): Promise<void> {
  const ext = `bhtest-${tag}-ext`;
  const hostEnd = `bhx${tag}`;
  const table = String(20000 + crypto.randomInt(10000));
  undo.push(() => run(['ip', 'netns', 'delete', ext]));
  undo.push(() => run(['ip', 'link', 'delete', hostEnd]));
  undo.push(() => run(['ip', 'rule', 'delete', 'iif', bridge, 'lookup', table]));
  undo.push(() => run(['ip', 'route', 'flush', 'table', table]));
  await run(['ip', 'netns', 'add', ext]);
  await run(['ip', 'link', 'add', hostEnd, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ext]);
  await run(['ip', 'addr', 'add', `${transit(1)}/30`, 'dev', hostEnd]);
  await run(['ip', 'link', 'set', hostEnd, 'up']);
  await inNs(ext, ['ip', 'addr', 'add', `${transit(2)}/30`, 'dev', 'eth0']);
  for (const a of addresses) await inNs(ext, ['ip', 'addr', 'add', `${a}/32`, 'dev', 'eth0']);
  await inNs(ext, ['ip', 'link', 'set', 'eth0', 'up']);
  await inNs(ext, ['ip', 'link', 'set', 'lo', 'up']);
  await inNs(ext, ['ip', 'route', 'add', 'default', 'via', transit(1)]);
  for (const a of addresses) await run(['ip', 'route', 'add', `${a}/32`, 'via', transit(2), 'dev', hostEnd, 'table', table]);
  await run(['ip', 'route', 'add', 'unreachable', 'default', 'table', table]);
  await run(['ip', 'rule', 'add', 'iif', bridge, 'lookup', table, 'priority', '100']);
  await nsProcess(ext, TCP_SERVER, '7000');
}

t.test('with outbound on: link-local, the host, the platform and protected nets stay out of reach', async (t) => {
  // A network of its own (tag, /16, chains), outbound on.
  const outTag = crypto.randomBytes(3).toString('hex');
  const outDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-out-test-${outTag}-`));
  const second = Number(boxSubnet.split('.')[1]) === 250 ? 251 : 250;
  const outSubnet = `10.${second}.0.0/16`;
  const platform = { redisUrl: 'redis://198.51.100.10:6379', databaseUrl: 'postgres://boxhost:secret@198.51.100.11:5432/boxhost', protectedNets: ['203.0.113.0/24'] };
  const outNet = new CniNetwork({ dataDir: outDir, hostTag: outTag, boxSubnet: outSubnet, outbound: true, protectedDestinations: () => platformDestinations(platform), logger });
  undo.push(async () => {
    await outNet.destroyAll();
    fs.rmSync(outDir, { recursive: true, force: true });
  });
  await outNet.init();
  const o1 = await outNet.attach('o1', { index: 1 });
  const bridge = outNet.bridgeName(1);

  // Outside the box subnet (a node refuses a subnet another interface routes: subnetClash.ts).
  const transit = (n: number) => `100.64.${second}.${n}`;
  const outside = { metadata: '169.254.169.254', redis: '198.51.100.10', postgres: '198.51.100.11', agent: '203.0.113.5', control: '198.51.100.20' };
  await outsideWorld(outTag, bridge, transit, Object.values(outside));

  const probe = async (host: string, port = 7000) => (await inBox('o1', [process.execPath, '-e', TCP_PROBE, host, String(port)], outNet)).stdout.trim();

  t.match(await iptablesS(outNet.chains.chainOut), `-A BH-${outTag}-OUT -d 169.254.0.0/16 -j REJECT --reject-with icmp-admin-prohibited`);
  t.match(await iptablesS(outNet.chains.chainOut), `-A BH-${outTag}-OUT -d 198.51.100.10/32 -j REJECT --reject-with icmp-admin-prohibited`);
  t.equal(await probe(outside.control), `outside ${outside.control} from ${transit(1)}`, 'control: an unprotected outside address answers (NATed)');
  t.equal(await probe(outside.metadata), 'EHOSTUNREACH', 'link-local metadata (169.254.169.254) refused');
  t.equal(await probe(outside.redis), 'EHOSTUNREACH', "the platform's Redis (from REDIS_URL) refused");
  t.equal(await probe(outside.postgres), 'EHOSTUNREACH', "the platform's PostgreSQL (from DATABASE_URL) refused");
  t.equal(await probe(outside.agent), 'EHOSTUNREACH', 'an address of BOXHOST_PROTECTED_NETS (another node agent) refused');

  // The host's own addresses: INPUT takes only replies, outbound or not.
  const svc = await listen('0.0.0.0');
  const hostAddrs = [transit(1), o1.gateway];
  const eth = (JSON.parse((await run(['ip', '-j', '-4', 'addr', 'show', 'scope', 'global'])).stdout) as { ifname: string; addr_info: { local: string }[] }[])
    .filter((l) => !l.ifname.startsWith('bh'))
    .flatMap((l) => l.addr_info.map((a) => a.local));
  hostAddrs.push(...eth.slice(0, 1));
  for (const a of hostAddrs) {
    t.equal(await hostConnect(a, portOf(svc)), 'host service\n', `control: the host reaches its own ${a}`);
    t.equal(await probe(a, portOf(svc)), 'ECONNREFUSED', `the box is refused by the host's ${a}`);
  }

  logged.length = 0;
  await outNet.init();
  t.same(logged.filter((m) => /written|restored|removed/.test(m)), [], 'init with outbound rewrites nothing the second time');
});

t.test('a build box reaches the proxy port on its gateway while it is open, and nothing else of the host', async (t) => {
  const pkgTag = crypto.randomBytes(3).toString('hex');
  const pkgDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-pkg-test-${pkgTag}-`));
  const second = Number(boxSubnet.split('.')[1]) === 252 ? 253 : 252;
  const pkgNet = new CniNetwork({ dataDir: pkgDir, hostTag: pkgTag, boxSubnet: `10.${second}.0.0/16`, outbound: false, logger });
  undo.push(async () => {
    await pkgNet.destroyAll();
    fs.rmSync(pkgDir, { recursive: true, force: true });
  });
  await pkgNet.init();
  const builder = await pkgNet.attach('pb', { index: 1 });
  await pkgNet.attach('pn', { index: 1 });
  const proxy = await listen('0.0.0.0');
  const other = await listen('0.0.0.0');
  const probe = async (box: string, port: number) => (await inBox(box, [process.execPath, '-e', TCP_PROBE, builder.gateway, String(port)], pkgNet)).stdout.trim();

  t.equal(await probe('pb', portOf(proxy)), 'ECONNREFUSED', 'closed: the build box cannot reach the proxy port');
  t.equal(await pkgNet.openSources('pb', builder.address, portOf(proxy)), builder.gateway, 'answers the gateway the box reaches it on');
  await pkgNet.openSources('pb', builder.address, portOf(proxy));
  t.equal(await probe('pb', portOf(proxy)), 'host service', 'open: the proxy port answers the build box');
  t.equal(await probe('pb', portOf(other)), 'ECONNREFUSED', 'another port of the host stays closed');
  t.equal(await probe('pn', portOf(proxy)), 'ECONNREFUSED', 'a neighbour on the same bridge stays closed');
  t.equal((await iptablesS(pkgNet.chains.chainPkg)).split('\n').filter((l) => l.startsWith('-A ')).length, 1, 'one rule: opening again replaced it');
  t.same(await pkgNet.sourceBoxes(), ['pb']);

  await pkgNet.closeSources('pb');
  t.equal(await probe('pb', portOf(proxy)), 'ECONNREFUSED', 'closed again');
  t.same(await pkgNet.sourceBoxes(), []);
  await pkgNet.openSources('pb', builder.address, portOf(proxy));
  await pkgNet.detach('pb', { index: 1 });
  t.same(await pkgNet.sourceBoxes(), [], 'detach takes it back');
  await pkgNet.openSources('pn', (await pkgNet.attach('pn', { index: 1 })).address, portOf(proxy));
  await pkgNet.init();
  t.same(await pkgNet.sourceBoxes(), [], "a node's start empties them");
  await t.rejects(pkgNet.openSources('pn', '192.0.2.9', portOf(proxy)), /not in/);
  proxy.close();
  other.close();
});

t.test('platformDestinations: the hosts of REDIS_URL and DATABASE_URL, then BOXHOST_PROTECTED_NETS', async (t) => {
  t.same(await platformDestinations({ redisUrl: 'redis://:pw@198.51.100.10:6390/0', databaseUrl: 'postgresql://u:p@[2001:db8::5]:5432/db', protectedNets: ['203.0.113.0/24', '192.0.2.7'] }), [
    '203.0.113.0/24',
    '192.0.2.7',
    '198.51.100.10',
    '2001:db8::5',
  ]);
  t.ok((await platformDestinations({ redisUrl: 'redis://localhost:6379', protectedNets: [] })).includes('127.0.0.1'), 'a host name is resolved');
  t.same(await platformDestinations({ redisUrl: 'unix:/run/redis.sock', databaseUrl: 'sqlite:./boxhost.db', protectedNets: [] }), [], 'sockets and files: nothing');
  await t.rejects(platformDestinations({ databaseUrl: 'postgres://u@no-such-host.invalid/db', protectedNets: [] }), /cannot resolve no-such-host\.invalid/);
  t.equal(canonicalCidr('10.1.2.3/24'), '10.1.2.0/24');
  t.equal(canonicalCidr('10.1.2.3'), '10.1.2.3/32');
  t.equal(canonicalCidr('10.1.2.3/33'), null);
  t.equal(canonicalCidr('redis.internal'), null);
  const badTag = crypto.randomBytes(3).toString('hex');
  const badDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-bad-test-${badTag}-`));
  const bad = new CniNetwork({ dataDir: badDir, hostTag: badTag, boxSubnet: '10.254.0.0/16', outbound: true, protectedDestinations: async () => ['redis.internal'] });
  await t.rejects(bad.init(), /not an IPv4 address or CIDR/, 'a bad protected destination fails init');
  await bad.destroyAll();
  fs.rmSync(badDir, { recursive: true, force: true });
});

t.test('a subnet another interface of the machine routes is refused at init', async (t) => {
  // A stand-in for podman's cni-podman0 or a second boxhost: a dummy interface routing a /24.
  const dummy = `bhclash${crypto.randomBytes(2).toString('hex')}`;
  await run(['ip', 'link', 'add', dummy, 'type', 'bridge']);
  t.teardown(() => run(['ip', 'link', 'del', dummy], { allowFailure: true }));
  await run(['ip', 'addr', 'add', '10.254.7.1/24', 'dev', dummy]);
  await run(['ip', 'link', 'set', dummy, 'up']);
  const tag = crypto.randomBytes(3).toString('hex');
  const dir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-clash-test-${tag}-`));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const clash = new CniNetwork({ dataDir: dir, hostTag: tag, boxSubnet: '10.254.0.0/16', outbound: false, logger });
  const refused = await clash.init().then(() => null, (e: Error) => e);
  t.ok(refused instanceof ConfigError, `refused as a configuration error (${refused?.message})`);
  t.match(refused?.message, /^BOXHOST_BOX_SUBNET=10\.254\.0\.0\/16 is already routed on this machine: 10\.254\.7\.0\/24 via bhclash/);
  // Positive control: the same network on a subnet nothing routes starts.
  const free = new CniNetwork({ dataDir: dir, hostTag: tag, boxSubnet: '10.254.0.0/16', outbound: false, logger });
  await run(['ip', 'link', 'del', dummy]);
  await free.init();
  await free.destroyAll();
});

t.test('small blocks of a /20, and the layout lock', async (t) => {
  // A network of its own: /29 blocks (5 boxes each) of a /20 that also starts a /19.
  const smallTag = crypto.randomBytes(3).toString('hex');
  const smallDir = claimDir(fs.mkdtempSync(`/var/tmp/boxhost-cni-small-test-${smallTag}-`));
  // 10.255: no other network of this file routes there (a node refuses a subnet routed elsewhere).
  const subnet = `10.255.${32 * crypto.randomInt(8)}.0/20`;
  const wider = subnet.replace('/20', '/19');
  const net = (projectPrefix?: number, boxSubnet = subnet) => new CniNetwork({ dataDir: smallDir, hostTag: smallTag, boxSubnet, projectPrefix, outbound: false, logger });
  const small = net(29);
  const ids = ['s0', 's1', 's2', 's3', 's4', 's5'];
  undo.push(async () => {
    for (const id of ids) await run(['ip', 'netns', 'delete', small.netnsName(id)], { allowFailure: true });
    await small.destroyAll();
    fs.rmSync(smallDir, { recursive: true, force: true });
  });
  await small.init();
  const P = { index: 3 };
  const block = small.layout.block(3);
  t.match(JSON.parse(fs.readFileSync(path.join(smallDir, 'cni', 'layout.json'), 'utf8')), { subnet, projectPrefix: 29, recordedAt: /Z$/ }, 'the layout is recorded at the first init');

  const got: string[] = [];
  for (const id of ids.slice(0, 5)) got.push((await small.attach(id, P)).address);
  t.same([...got].sort(), ['26', '27', '28', '29', '30'].map((n) => formatIpv4(parseIpv4(block.network)! + Number(n) - 24)).sort(), `the five host addresses of ${block.cidr}, not its network, gateway or broadcast`);
  await t.rejects(small.attach('s5', P), /no IP addresses available/, 'a sixth: host-local has none left');
  const bridge = small.bridgeName(3);
  const brAddrs = (JSON.parse((await run(['ip', '-j', '-4', 'addr', 'show', 'dev', bridge])).stdout) as { addr_info: { local: string; prefixlen: number }[] }[])[0].addr_info;
  t.same(brAddrs.map((a) => `${a.local}/${a.prefixlen}`), [`${block.gateway}/29`], 'the bridge holds the gateway, with the block\'s mask');
  t.match(await iptablesS(small.chains.chainSrc), `-A BH-${smallTag}-SRC ! -s ${block.cidr} -i ${bridge} -j DROP`, 'the source rule is the block');
  const s0 = got[0];
  await nsProcess(small.netnsName('s0'), TCP_SERVER, '7000');
  const fromS1 = (await inBox('s1', [process.execPath, '-e', TCP_PROBE, s0, '7000'], small)).stdout.trim();
  t.equal(fromS1, `outside ${s0} from ${got[1]}`, 'neighbours in a /29 reach each other');
  t.equal(await hostConnect(s0, 7000), `outside ${s0} from ${block.gateway}\n`, 'the host reaches a box');
  t.same(small.layout.holds(3, (await small.attach('s0', P)).address), true, "an attached box's address is recognised as its block's (attach is idempotent)");

  const other = net(28);
  await t.rejects(other.init(), new RegExp(`laid out with BOXHOST_BOX_SUBNET=${subnet.replace(/\./g, '\\.')} BOXHOST_PROJECT_PREFIX=29 .*and 5 boxes hold addresses there; it is now set to BOXHOST_BOX_SUBNET=${subnet.replace(/\./g, '\\.')} BOXHOST_PROJECT_PREFIX=28`), 'another prefix while boxes hold addresses: init refuses');
  await t.rejects(other.attach('s5', { index: 1 }), /laid out with/, 'and a process that never ran init (a worker) will not attach under it');
  const widened = net(29, wider);
  await widened.init();
  t.equal(JSON.parse(fs.readFileSync(path.join(smallDir, 'cni', 'layout.json'), 'utf8')).subnet, wider, 'widening the subnet from its first address keeps every block: accepted');
  t.equal(widened.subnet(3), block.cidr);

  for (const id of ids) await widened.detach(id, P);
  t.equal(await widened.releaseProject(P), true);
  await small.attach('s0', { index: 1 });
  await small.detach('s0', { index: 1 }); // its bridge stays (no release): a leftover of the old layout
  t.ok(fs.existsSync(`/sys/class/net/${small.bridgeName(1)}`));
  await other.init();
  t.equal(JSON.parse(fs.readFileSync(path.join(smallDir, 'cni', 'layout.json'), 'utf8')).projectPrefix, 28, 'no box holds an address: the new layout is taken');
  t.notOk(fs.existsSync(`/sys/class/net/${small.bridgeName(1)}`), "the old layout's bridge (and its gateway address) is gone");
  t.equal(other.layout.block(200).cidr, formatIpv4(parseIpv4(subnet.split('/')[0])! + 200 * 16) + '/28');
  await other.attach('s0', { index: 200 });
  const high = other.bridgeName(200);
  await net().destroyAll();
  t.notOk(fs.existsSync(`/sys/class/net/${high}`), 'destroyAll removes bridges whatever its own layout (test cleanup knows no prefix)');
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
  const rs = await bridgeRuleset();
  t.notMatch(rs, network.portTable, 'port table removed');
  t.notMatch(rs, `bh${hostTag}-`, 'no macspoofchk leftovers');
  const links = (await run(['ip', '-o', 'link', 'show'])).stdout;
  t.notMatch(links, network.bridgeName(1));
  t.notMatch(links, network.bridgeName(2));
});
