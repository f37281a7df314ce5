/**
 * The box network layout without root (docs/decisions.md "Network"): the address math of
 * core/netblocks.ts on /16 and other subnets, the config's checks of BOXHOST_BOX_SUBNET and
 * BOXHOST_PROJECT_PREFIX, the CNI driver's names and blocks, the layout record, the public
 * reason of an exhausted block, and the api's refusals (no project index left, no address left
 * on a node, placement passing over a full node) on a sqlite file.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { assertSubnetFree, clashes, parseRoutes } from '../workers/network/subnetClash';
import { ConfigError, loadConfig } from '../core/config';
import { BoxhostError } from '../core/errors';
import { newBoxId, now } from '../core/ids';
import { defaultProjectPrefix, formatIpv4, layoutError, MAX_PROJECTS_BY_IDS, NetLayout, parseIpv4, parseNet } from '../core/netblocks';
import { projectIdMap } from '../core/box';
import { createDb, migrate, type Db } from '../db/knex';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import type { NodeRow } from '../db/repos/nodes';
import { NoFreeNetIndex, projectsRepo } from '../db/repos/projects';
import { NodeDirectory } from '../domain/nodes';
import { assertAddressRoom, ensureProject, nodesWithoutAddress } from '../domain/projects';
import { publicReason } from '../jobs/publicReason';
import { keyQuotaFor } from '../workers/keyQuota';
import { CniNetwork } from '../workers/network/cni';
import { canonicalCidr } from '../workers/network/firewall';
import { layoutChanged, readLayout, writeLayout } from '../workers/network/layoutLock';
import { MockNetwork } from '../workers/network/mock';

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-net-'));
const config = (env: Record<string, string>) => loadConfig({ BOXHOST_DATA_DIR: '/nonexistent/unit', ...env }, { readDotenv: false });
const configError = (env: Record<string, string>): string => {
  try {
    config(env);
    return '<accepted>';
  } catch (e) {
    return e instanceof ConfigError ? e.message : `<${String(e)}>`;
  }
};

t.test('the default layout: a /22 per project of 10.88.0.0/16', async (t) => {
  const l = new NetLayout('10.88.0.0/16', 22);
  t.equal(l.maxProjects, 64);
  t.equal(l.boxesPerProject, 1021, '1024 but network, gateway and broadcast');
  t.same(l.block(0), { cidr: '10.88.0.0/22', network: '10.88.0.0', prefix: 22, gateway: '10.88.0.1', rangeStart: '10.88.0.2', rangeEnd: '10.88.3.254', broadcast: '10.88.3.255' });
  t.same(l.block(1), { cidr: '10.88.4.0/22', network: '10.88.4.0', prefix: 22, gateway: '10.88.4.1', rangeStart: '10.88.4.2', rangeEnd: '10.88.7.254', broadcast: '10.88.7.255' });
  t.equal(l.block(63).cidr, '10.88.252.0/22');
  t.equal(l.block(63).broadcast, '10.88.255.255', 'the last block ends with the subnet');
  t.ok(l.has(63));
  t.notOk(l.has(64));
  t.notOk(l.has(-1));
  t.notOk(l.has(1.5));
  t.throws(() => l.block(64), /index must be 0…63/);
  t.ok(l.holds(1, '10.88.4.2'));
  t.ok(l.holds(1, '10.88.5.0'), 'a .0 inside a block is a host address');
  t.ok(l.holds(1, '10.88.7.254'));
  t.notOk(l.holds(1, '10.88.4.1'), 'not the gateway');
  t.notOk(l.holds(1, '10.88.4.0'), 'not the network');
  t.notOk(l.holds(1, '10.88.7.255'), 'not the broadcast');
  t.notOk(l.holds(1, '10.88.8.2'), 'not the next block');
  t.ok(l.inSubnet('10.88.255.255'));
  t.notOk(l.inSubnet('10.89.0.1'));
  t.equal(l.describe(), 'BOXHOST_BOX_SUBNET=10.88.0.0/16 BOXHOST_PROJECT_PREFIX=22');
});

t.test('other subnets and prefixes', async (t) => {
  const old = new NetLayout('10.88.0.0/16', 24);
  t.equal(old.maxProjects, 256, 'the layout before BOXHOST_PROJECT_PREFIX');
  t.equal(old.boxesPerProject, 253);
  t.equal(old.block(7).cidr, '10.88.7.0/24');

  const small = new NetLayout('172.16.16.0/20', 29);
  t.equal(small.maxProjects, 512);
  t.equal(small.boxesPerProject, 5);
  t.same(small.block(3), { cidr: '172.16.16.24/29', network: '172.16.16.24', prefix: 29, gateway: '172.16.16.25', rangeStart: '172.16.16.26', rangeEnd: '172.16.16.30', broadcast: '172.16.16.31' });
  t.equal(small.block(511).broadcast, '172.16.31.255');

  const one = new NetLayout('192.168.7.0/24', 24);
  t.equal(one.maxProjects, 1, 'a /24 subnet holds one project of /24');
  t.equal(one.block(0).rangeEnd, '192.168.7.254');

  const two = new NetLayout('10.150.2.0/23', 24);
  t.equal(two.maxProjects, 2);
  t.equal(two.block(1).cidr, '10.150.3.0/24');

  const odd = new NetLayout('10.4.0.0/14', 19);
  t.equal(odd.maxProjects, 32);
  t.equal(odd.block(9).cidr, '10.5.32.0/19', 'blocks cross octets');
  t.equal(odd.block(9).rangeEnd, '10.5.63.254');
  t.equal(odd.boxesPerProject, 8189);

  const huge = new NetLayout('10.0.0.0/8', 29);
  t.equal(huge.maxProjects, MAX_PROJECTS_BY_IDS, '2^21 blocks, but no more projects than user-id ranges');
  const lastIds = projectIdMap(huge.maxProjects - 1);
  t.ok(lastIds.hostId + lastIds.size - 1 < 2 ** 32 - 1, 'the last project\'s ids fit 32 bits');
  t.equal(huge.block(huge.maxProjects - 1).cidr, formatIpv4(parseIpv4('10.0.0.0')! + (huge.maxProjects - 1) * 8) + '/29');
});

t.test('parsing and validating', async (t) => {
  t.equal(parseIpv4('10.1.2.3'), 10 * 2 ** 24 + 1 * 2 ** 16 + 2 * 256 + 3);
  t.equal(parseIpv4('10.1.2.256'), null);
  t.equal(parseIpv4('10.1.2'), null);
  t.equal(formatIpv4(2 ** 32 - 1), '255.255.255.255');
  t.same(parseNet('10.88.0.0/16'), { base: parseIpv4('10.88.0.0'), prefix: 16 });
  t.match(parseNet('10.88.1.0/16'), /did you mean 10\.88\.0\.0\/16\?/);
  t.match(parseNet('10.0.0.0/7'), /from \/8 to \/24/);
  t.match(parseNet('10.0.0.0/25'), /from \/8 to \/24/);
  t.match(parseNet('10.0.0.0'), /must be/);
  t.equal(layoutError('10.88.0.0/16', 22), null);
  t.match(layoutError('10.88.0.0/16', 15), /BOXHOST_PROJECT_PREFIX must be from 16/);
  t.match(layoutError('10.88.0.0/16', 30), /to 29, not 30/);
  t.equal(defaultProjectPrefix('10.88.0.0/16'), 22);
  t.equal(defaultProjectPrefix('10.88.0.0/23'), 23, 'a subnet narrower than /22 is one project');
  t.throws(() => new NetLayout('10.88.0.0/16', 12));
  t.equal(canonicalCidr('10.1.2.3/24'), '10.1.2.0/24', "the driver's CIDR helper on the same math");
  t.equal(canonicalCidr('10.1.2.3'), '10.1.2.3/32');
  t.equal(canonicalCidr('10.1.2.3/33'), null);
});

t.test('keeping a layout: only the subnet widened from its first address', async (t) => {
  const was = new NetLayout('10.88.0.0/16', 22);
  t.ok(was.keeps(was));
  t.ok(new NetLayout('10.88.0.0/15', 22).keeps(was), 'wider, same start: every block stays');
  t.equal(new NetLayout('10.88.0.0/15', 22).block(5).cidr, was.block(5).cidr);
  t.notOk(new NetLayout('10.88.0.0/17', 22).keeps(was), 'narrower');
  t.notOk(new NetLayout('10.88.0.0/16', 24).keeps(was), 'another prefix');
  t.notOk(new NetLayout('10.90.0.0/16', 22).keeps(was), 'another start');
  t.notOk(new NetLayout('10.80.0.0/12', 22).keeps(was), 'wider but from another start');
  t.equal(was.widened(), '10.88.0.0/15');
  t.equal(new NetLayout('10.89.0.0/16', 22).widened(), null, '10.89 starts no /15');
  t.equal(new NetLayout('10.0.0.0/8', 22).widened(), null, 'nothing is wider than /8');
});

t.test('config: BOXHOST_BOX_SUBNET and BOXHOST_PROJECT_PREFIX', async (t) => {
  t.match(config({}), { boxSubnet: '10.88.0.0/16', projectPrefix: 22 });
  t.match(config({ BOXHOST_BOX_SUBNET: '172.20.0.0/14', BOXHOST_PROJECT_PREFIX: '26' }), { boxSubnet: '172.20.0.0/14', projectPrefix: 26 });
  t.match(config({ BOXHOST_BOX_SUBNET: '10.1.0.0/23' }), { projectPrefix: 23 }, 'unset and the subnet narrower than /22: the subnet');
  t.match(config({ BOXHOST_BOX_SUBNET: '10.1.0.0/16', BOXHOST_PROJECT_PREFIX: '16' }), { projectPrefix: 16 }, 'one project of the whole subnet');
  t.equal(configError({ BOXHOST_BOX_SUBNET: '10.88.1.0/16' }), 'invalid BOXHOST_BOX_SUBNET="10.88.1.0/16": must be an aligned IPv4 network from /8 to /24, such as 10.88.0.0/16 (did you mean 10.88.0.0/16?)');
  t.equal(configError({ BOXHOST_BOX_SUBNET: '10.0.0.0/25' }), 'invalid BOXHOST_BOX_SUBNET="10.0.0.0/25": must be an aligned IPv4 network from /8 to /24, such as 10.88.0.0/16');
  t.equal(configError({ BOXHOST_BOX_SUBNET: 'fd00::/64' }), 'invalid BOXHOST_BOX_SUBNET="fd00::/64": must be an aligned IPv4 network from /8 to /24, such as 10.88.0.0/16');
  t.equal(configError({ BOXHOST_BOX_SUBNET: '10.1.0.0/20', BOXHOST_PROJECT_PREFIX: '19' }), 'invalid BOXHOST_PROJECT_PREFIX="19": must be from 20 (the prefix of BOXHOST_BOX_SUBNET) to 29');
  t.equal(configError({ BOXHOST_PROJECT_PREFIX: '30' }), 'invalid BOXHOST_PROJECT_PREFIX="30": must be from 16 (the prefix of BOXHOST_BOX_SUBNET) to 29');
  t.equal(configError({ BOXHOST_PROJECT_PREFIX: 'wide' }), 'invalid BOXHOST_PROJECT_PREFIX="wide": must be a number');
});

t.test('the CNI driver builds on the layout (names only: nothing runs)', async (t) => {
  const n = new CniNetwork({ dataDir: '/nonexistent/unit', hostTag: 'abcdef', boxSubnet: '10.150.0.0/20', projectPrefix: 26, outbound: false });
  t.equal(n.boxSubnet, '10.150.0.0/20');
  t.equal(n.subnet(5), '10.150.1.64/26');
  t.equal(n.gateway(5), '10.150.1.65');
  t.equal(n.bridgeName(63), 'bhabcdp63');
  t.throws(() => n.bridgeName(64), /0…63/);
  const byDefault = new CniNetwork({ dataDir: '/nonexistent/unit', hostTag: 'abcdef', boxSubnet: '10.150.0.0/16', outbound: false });
  t.equal(byDefault.subnet(2), '10.150.8.0/22', 'no prefix given: /22');
  t.equal(new CniNetwork({ dataDir: '/x', hostTag: 'abcdef', boxSubnet: '10.150.0.0/24', outbound: false }).layout.maxProjects, 1);
  t.throws(() => new CniNetwork({ dataDir: '/x', hostTag: 'abcdef', boxSubnet: '10.150.0.0/16', projectPrefix: 30, outbound: false }), /BOXHOST_PROJECT_PREFIX/);
  const widest = new CniNetwork({ dataDir: '/x', hostTag: 'abcdef', boxSubnet: '10.0.0.0/8', projectPrefix: 29, outbound: false });
  t.ok(widest.bridgeName(widest.layout.maxProjects - 1).length <= 15, 'the highest index still names a bridge (IFNAMSIZ)');
});

t.test('the mock hands addresses from the same blocks, and runs out the same way', async (t) => {
  const m = new MockNetwork(new NetLayout('10.250.0.0/16', 29));
  const got: string[] = [];
  for (let i = 0; i < 5; i++) got.push((await m.attach(`b${i}`, { index: 2 })).address);
  t.same(got, ['10.250.0.18', '10.250.0.19', '10.250.0.20', '10.250.0.21', '10.250.0.22']);
  await t.rejects(m.attach('b5', { index: 2 }), /no IP addresses available/);
  await m.detach('b1', { index: 2 });
  t.equal((await m.attach('b5', { index: 2 })).address, '10.250.0.19', 'a freed address is handed out again');
});

t.test('the layout record', async (t) => {
  const dir = tmp();
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  t.equal(await readLayout(dir), null, 'none yet');
  await writeLayout(dir, new NetLayout('10.88.0.0/16', 22));
  t.equal((await readLayout(dir))?.describe(), 'BOXHOST_BOX_SUBNET=10.88.0.0/16 BOXHOST_PROJECT_PREFIX=22');
  t.same(fs.readdirSync(path.join(dir, 'cni')), ['layout.json'], 'written whole, no temp file left');
  fs.writeFileSync(path.join(dir, 'cni', 'layout.json'), '{"subnet": "10.88.0.0/16"');
  t.ok((await readLayout(dir).catch((e: unknown) => e)) instanceof ConfigError, 'a torn record is an error, not a guess');
  const e = layoutChanged(dir, new NetLayout('10.88.0.0/16', 22), new NetLayout('10.88.0.0/16', 29), 3, false);
  t.ok(e instanceof ConfigError, 'the process exits as on a bad variable');
  t.match(e.message, /laid out with BOXHOST_BOX_SUBNET=10\.88\.0\.0\/16 BOXHOST_PROJECT_PREFIX=22 \(recorded in .*layout\.json\), and 3 boxes hold addresses there; it is now set to BOXHOST_BOX_SUBNET=10\.88\.0\.0\/16 BOXHOST_PROJECT_PREFIX=29/);
  t.match(layoutChanged(dir, new NetLayout('10.88.0.0/16', 24), new NetLayout('10.88.0.0/16', 22), 1, true).message, /older than BOXHOST_PROJECT_PREFIX \(a \/24 per project\), and 1 box holds addresses there/);
});

t.test('publicReason: an exhausted block, never the CNI command line', async (t) => {
  const cni = Object.assign(new Error('CNI_COMMAND=ADD /usr/lib/cni/bridge eth0 abc exited 1: failed to allocate for range 0: no IP addresses available in range set: 10.88.4.2-10.88.4.6'), {
    argv: ['CNI_COMMAND=ADD', '/usr/lib/cni/bridge', 'eth0', 'abc'], exitCode: 1, stdout: '', stderr: 'failed to allocate for range 0: no IP addresses available in range set: 10.88.4.2-10.88.4.6',
  });
  t.equal(publicReason(cni), "the network set-up failed: the project's network on this node has no free address (delete boxes of the project there) (exit status 1)");
  t.equal(publicReason(new Error(cni.message)), "the network set-up failed: the project's network on this node has no free address (delete boxes of the project there)");
  const runc = Object.assign(new Error('runc run exited 1'), { argv: ['runc', 'run', '-d'], exitCode: 1, stdout: '', stderr: 'runc run failed: unable to start container process: unable to join session keyring: disk quota exceeded' });
  t.equal(publicReason(runc), "the container runtime failed: the node's kernel key quota for the project's boxes is full (kernel.keys.maxkeys) (exit status 1)", 'not "out of space"');
});

t.test("the kernel key quota holds a full block of one project's boxes", async (t) => {
  t.same(keyQuotaFor(new NetLayout('10.88.0.0/16', 22).boxesPerProject), { keys: 1037, bytes: 103700 }, 'the default layout: over the kernel default of 200 keys, 20000 bytes');
  t.same(keyQuotaFor(5), { keys: 21, bytes: 2100 });
});

t.test('the api refuses up front: projects, addresses, placement', async (t) => {
  const dataDir = tmp();
  const db: Db = createDb({ dataDir, databaseUrl: undefined });
  await migrate(db);
  t.teardown(async () => {
    await db.destroy();
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
  // Two projects of /24 in a /23; five boxes of /29 would be another test: here 253 per block.
  const ctx = { db, config: config({ BOXHOST_BOX_SUBNET: '10.150.2.0/23', BOXHOST_PROJECT_PREFIX: '24' }) };
  const at = now();
  // n1 has the more RAM: placement prefers it.
  for (const [id, ram] of [['n1', 2 << 20], ['n2', 1 << 20]] as const) {
    await db<NodeRow>('nodes').insert({
      id, name: id, region: 'r', agent_url: null, state: 'active', cpus: 64, ram_mb: ram, disk_gb: 100000,
      version: '0.1.0', started_at: at, heartbeat_at: at, storage: 'ok', created_at: at, updated_at: at,
    });
  }
  const addBoxes = async (project: string, node: string, n: number, status: BoxRecord['status'] = 'running') => {
    const rows = Array.from({ length: n }, (): BoxRecord => ({
      id: newBoxId(), project, name: `b${newBoxId()}`, status, error: null, base: 'tiny@v1', fork: null,
      config: { cpus: 0, ram_mb: 1, region: 'r', storage_gb: 0 }, environment: {}, tags: {}, data_mounts: [],
      lifecycle: null, pack: null, pack_rev: null, rollback_to: null, termination_grace_period_seconds: 10, url_settings: null,
      node, address: null, created_at: at, updated_at: at,
    }));
    for (const r of rows) await boxesRepo.insert(db, r);
  };

  t.test('projects: as many as the layout has blocks, then 409', async (t) => {
    t.equal((await ensureProject(ctx, db, 'p0')).net_index, 0);
    t.equal((await ensureProject(ctx, db, 'p1')).net_index, 1);
    t.equal((await ensureProject(ctx, db, 'p0')).net_index, 0, 'an existing project is found, not made');
    t.ok((await projectsRepo.ensure(db, 'p2', 2).catch((e: unknown) => e)) instanceof NoFreeNetIndex, 'the repo says no index is left');
    const e = await ensureProject(ctx, db, 'p2').catch((x: unknown) => x);
    t.ok(e instanceof BoxhostError && e.code === 'conflict', '409 conflict');
    t.equal((e as Error).message, 'no network is left for a new project p2: BOXHOST_BOX_SUBNET=10.150.2.0/23 holds 2 projects of /24 (BOXHOST_PROJECT_PREFIX=24) and all exist; ' +
      'widen BOXHOST_BOX_SUBNET from its first address on the api and every node, or use a longer BOXHOST_PROJECT_PREFIX (fewer boxes per project; only on nodes that hold no boxes)',
      'no wider subnet starts at 10.150.2.0: none is suggested');
    const wide = { config: config({ BOXHOST_BOX_SUBNET: '10.150.0.0/24', BOXHOST_PROJECT_PREFIX: '24' }) };
    t.match((await ensureProject(wide, db, 'p3').catch((x: unknown) => x)) as Error, { message: /widen BOXHOST_BOX_SUBNET from its first address \(10\.150\.0\.0\/23 holds twice as many\) on the api/ });
    t.equal(await projectsRepo.get(db, 'p2'), undefined, 'no row');
  });

  t.test('addresses: every box row of the project on the node counts', async (t) => {
    await addBoxes('p0', 'n1', 252);
    await assertAddressRoom(ctx, db, 'p0', 'n1');
    await addBoxes('p0', 'n1', 1, 'deleting');
    const e = await assertAddressRoom(ctx, db, 'p0', 'n1').catch((x: unknown) => x);
    t.ok(e instanceof BoxhostError && e.code === 'conflict', 'the 254th → 409 (a box being deleted still holds its address)');
    t.equal((e as Error).message, 'project p0 has no free address on node n1: its network 10.150.2.0/24 holds 253 boxes (BOXHOST_PROJECT_PREFIX=24); delete boxes of the project there, or widen the project prefix (on a node that holds no boxes)');
    await assertAddressRoom(ctx, db, 'p0', 'n2');
    await assertAddressRoom(ctx, db, 'p1', 'n1');
    t.pass('another node, another project: room');
  });

  t.test('placement passes over a node where the project is full', async (t) => {
    const nodes = new NodeDirectory(db, { timeoutMs: 60_000 });
    const need = { cpus: 0, ram_mb: 1, storage_gb: 0 };
    const full = await nodesWithoutAddress(ctx, 'p0');
    t.same([...full.keys()], ['n1']);
    t.equal(await nodes.place('r', need, full), 'n2', 'n1 would win on free RAM, but p0 is full there');
    t.equal(await nodes.place('r', need), 'n1', 'without the project, n1');
    await addBoxes('p0', 'n2', 253);
    const e = await nodes.place('r', need, await nodesWithoutAddress(ctx, 'p0')).catch((x: unknown) => x);
    t.ok(e instanceof BoxhostError && e.code === 'conflict', 'full everywhere → 409');
    t.match((e as Error).message, /^project p0 has no free address on node n\d: .*; project p0 has no free address on node n\d: /);
    t.same([...(await nodesWithoutAddress(ctx, 'p1')).keys()], [], 'p1 has room everywhere');
    t.same([...(await nodesWithoutAddress(ctx, 'nobody')).keys()], [], 'a project yet to be made too');
  });

  t.test('a project made under a wider layout is refused, not misplaced', async (t) => {
    const narrower = { config: config({ BOXHOST_BOX_SUBNET: '10.150.2.0/24', BOXHOST_PROJECT_PREFIX: '24' }) };
    const e = await assertAddressRoom(narrower, db, 'p1', 'n1').catch((x: unknown) => x);
    t.ok(e instanceof BoxhostError && e.code === 'conflict');
    t.match((e as Error).message, /project p1 has network index 1, outside BOXHOST_BOX_SUBNET=10\.150\.2\.0\/24 BOXHOST_PROJECT_PREFIX=24 \(1 projects\)/);
  });
});

t.test('the box subnet against the machine\'s routes (workers/network/subnetClash.ts)', async (t) => {
  // /proc/net/route as the kernel writes it: little-endian hex destination and mask.
  const table = [
    'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT',
    'eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0',
    'eth0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0',
    'cni-podman0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0',
    'bhabcdp0\t0000590A\t00000000\t0001\t0\t0\t0\t00FCFFFF\t0\t0\t0',
    'corp0\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0',
    // Not up, and an unreachable route: neither puts a gateway on an address.
    'down0\t00005A0A\t00000000\t0000\t0\t0\t0\t0000FFFF\t0\t0\t0',
    '*\t00005B0A\t00000000\t0201\t0\t0\t0\t0000FFFF\t0\t0\t0',
  ].join('\n');
  const routes = parseRoutes(table);
  t.same(routes.map((r) => [r.iface, formatIpv4(r.base), r.prefix]), [
    ['eth0', '0.0.0.0', 0], ['eth0', '192.168.2.0', 24], ['cni-podman0', '10.88.0.0', 16], ['bhabcdp0', '10.89.0.0', 22], ['corp0', '10.0.0.0', 8],
  ]);
  const podman = clashes(routes, '10.88.0.0/16', 'bhabcdp');
  t.same(podman.inside.map((r) => r.iface), ['cni-podman0'], "podman's default network clashes with the default subnet");
  t.same(podman.wider.map((r) => r.iface), ['corp0'], 'a /8 LAN holds it: a warning only');
  t.same(clashes(routes, '10.89.0.0/16', 'bhabcdp').inside, [], "this node's own bridges are no clash");
  t.same(clashes(routes, '10.89.0.0/16', 'bhzzzzp').inside.map((r) => r.iface), ['bhabcdp0'], "another boxhost's bridge is");
  t.same(clashes(routes, '172.30.0.0/16', 'bhabcdp'), { inside: [], wider: [] }, 'the default route is never a clash');
  const file = path.join(os.tmpdir(), `routes-${process.pid}`);
  fs.writeFileSync(file, table);
  t.teardown(() => fs.rmSync(file, { force: true }));
  const refused = await assertSubnetFree('10.88.0.0/16', 'bhabcdp', undefined, file).then(() => null, (e: Error) => e);
  t.ok(refused instanceof ConfigError, 'a configuration error');
  t.match(refused?.message, /10\.88\.0\.0\/16 via cni-podman0/);
  const warned: unknown[] = [];
  await assertSubnetFree('10.90.0.0/16', 'bhabcdp', { debug: () => undefined, info: () => undefined, warn: (o) => warned.push(o) }, file);
  t.same(warned, [{ route: '10.0.0.0/8', iface: 'corp0', subnet: '10.90.0.0/16' }]);
  await assertSubnetFree('10.88.0.0/16', 'bhabcdp', undefined, '/nonexistent/route');
});
