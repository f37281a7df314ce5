import t from 'tap';
import { ConfigError, loadConfig } from '../core/config';
import { createLogger } from '../core/logger';
import { NetLayout } from '../core/netblocks';
import { startHost } from '../server/host';
import { cleanupHost } from './helpers/cleanup';
import { request, startTestHost, testConfig, testSubnet } from './helpers/host';
import { hostInventory, rowCounts } from './helpers/hostState';

/**
 * Room for boxes and projects on a real host (docs/decisions.md "Network"): a project holds as
 * many boxes per node as its block has addresses, an installation as many projects as its
 * subnet has blocks; past either the api answers 409 at once, before any row or job, with what
 * to change. A node keeps the layout its boxes were addressed under.
 */
const P = '/v1/projects';
const SMALL = { ram_mb: 64, storage_gb: 1 };

t.test('a project holds as many boxes on a node as its block has addresses', async (t) => {
  // /29 blocks: 5 boxes per project.
  const host = await startTestHost(t, { BOXHOST_PROJECT_PREFIX: '29' });
  const layout = new NetLayout(host.config.boxSubnet, 29);
  const create = (project: string, name: string, extra: object = {}, wait = 0) =>
    host.call('POST', `${P}/${project}/boxes${wait ? `?wait=${wait}` : ''}`, { body: { name, config: SMALL, ...extra } });
  const block = async (project: string) => layout.block(Number((await host.db('projects').where({ name: project }).first()).net_index));

  const first = await Promise.all(['r0', 'r1', 'r2', 'r3'].map((n) => create('room', n, {}, 120)));
  t.same(first.map((r) => r.status), [200, 200, 200, 200], first.map((r) => r.text).join(' | '));
  const cidr = (await block('room')).cidr;
  const addresses = first.map((r) => r.body.address as string);
  t.equal(new Set(addresses).size, 4, 'four addresses');
  const index = Number((await host.db('projects').where({ name: 'room' }).first()).net_index);
  t.ok(addresses.every((a) => layout.holds(index, a)), `all in ${cidr}`);

  t.test('at the edge, concurrent creates: exactly one is accepted', async (t) => {
    const before = await rowCounts(host.db);
    const edge = await Promise.all(['e1', 'e2', 'e3'].map((n) => create('room', n)));
    t.same(edge.map((r) => r.status).sort(), [202, 409, 409], edge.map((r) => r.text).join(' | '));
    t.same(await rowCounts(host.db), { boxes: before.boxes + 1, operations: before.operations + 1 }, 'one box row and one operation, for the accepted one');
    const accepted = edge.find((r) => r.status === 202)!;
    const op = await host.call('GET', `/v1/operations/${accepted.headers.get('operation-id')}/wait?timeout=120`);
    t.equal(op.body.status, 'succeeded', JSON.stringify(op.body));
  });

  const message = `project room has no free address on node local: its network ${cidr} holds 5 boxes (BOXHOST_PROJECT_PREFIX=29); ` +
    'delete boxes of the project there, or widen the project prefix (on a node that holds no boxes)';

  t.test('the sixth is refused at once with the contract error; nothing is written', async (t) => {
    const before = await rowCounts(host.db);
    const t0 = Date.now();
    const sixth = await create('room', 'r5', {}, 60);
    // Generous: the row counts below are what proves no job ran; this says it did not wait on one.
    t.ok(Date.now() - t0 < 10_000, `answered up front (${Date.now() - t0} ms), not by a job`);
    t.equal(sixth.status, 409);
    t.same(sixth.body, { error: { code: 'conflict', message, details: [] } });
    const fork = await create('room', 'r0-fork', { fork: 'r0' });
    t.equal(fork.status, 409, 'a fork too (it goes to the same node, the same block)');
    t.equal(fork.body.error.message, message);
    t.same(await rowCounts(host.db), before, 'no box row, no operation');
    t.equal((await host.call('GET', `${P}/room/boxes/r5`)).status, 404);
    const list = (await host.call('GET', `${P}/room/boxes`)).body.boxes as { status: string }[];
    t.same(list.map((b) => b.status), Array(5).fill('running'), 'the five run; none failed');
  });

  t.test('another project has its own block', async (t) => {
    const other = await create('elsewhere', 'x', {}, 120);
    t.equal(other.status, 200, other.text);
    t.ok(layout.holds(Number((await host.db('projects').where({ name: 'elsewhere' }).first()).net_index), other.body.address));
    t.equal((await host.call('DELETE', `${P}/elsewhere/boxes/x?wait=120`)).status, 204);
  });

  t.test('a delete makes room again', async (t) => {
    t.equal((await host.call('DELETE', `${P}/room/boxes/r1?wait=120`)).status, 204);
    const again = await create('room', 'r5', {}, 120);
    t.equal(again.status, 200, again.text);
    t.equal(again.body.status, 'running');
    t.ok(layout.holds(index, again.body.address), `its address is of ${cidr} again`);
  });

  t.test('deleting them leaves no address held', async (t) => {
    const boxes = (await host.call('GET', `${P}/room/boxes`)).body.boxes as { name: string }[];
    const gone = await Promise.all(boxes.map((b) => host.call('DELETE', `${P}/room/boxes/${b.name}?wait=120`)));
    t.same(gone.map((r) => r.status), Array(5).fill(204));
    t.same((await hostInventory(host.config)).leases, [], 'no lease left');
  });
});

t.test('an installation holds as many projects as its subnet has blocks', async (t) => {
  // A /23 of the random /16 test subnet, cut in /24s: two projects.
  const subnet = testSubnet().replace('/16', '/23');
  const host = await startTestHost(t, { BOXHOST_BOX_SUBNET: subnet, BOXHOST_PROJECT_PREFIX: '24' });
  const layout = new NetLayout(subnet, 24);
  t.equal(layout.maxProjects, 2);
  t.equal((await host.call('PUT', `${P}/pa`, { body: { quotas: { boxes: 10 } } })).status, 200, 'a project made by its quotas');
  const b = await host.call('POST', `${P}/pb/boxes?wait=120`, { body: { name: 'one', config: SMALL } });
  t.equal(b.status, 200, b.text);
  t.ok(layout.holds(1, b.body.address), `the second project's box is in ${layout.block(1).cidr}: ${b.body.address}`);

  const before = await rowCounts(host.db);
  const third = await host.call('POST', `${P}/pc/boxes`, { body: { name: 'one', config: SMALL } });
  t.equal(third.status, 409);
  t.equal(third.body.error.code, 'conflict');
  const wider = subnet.replace('/23', '/22');
  t.equal(third.body.error.message, `no network is left for a new project pc: BOXHOST_BOX_SUBNET=${subnet} holds 2 projects of /24 (BOXHOST_PROJECT_PREFIX=24) and all exist; ` +
    `widen BOXHOST_BOX_SUBNET from its first address (${wider} holds twice as many) on the api and every node, or use a longer BOXHOST_PROJECT_PREFIX (fewer boxes per project; only on nodes that hold no boxes)`);
  t.same(await rowCounts(host.db), before, 'no box row, no operation');
  t.equal((await host.call('PUT', `${P}/pc`, { body: { quotas: { boxes: 10 } } })).status, 409, 'nor by its quotas');
  t.equal((await host.call('GET', `${P}/pc`)).status, 404, 'the project was not made');
  t.equal((await host.call('DELETE', `${P}/pb/boxes/one?wait=120`)).status, 204);
});

t.test('a node keeps the layout its boxes were addressed under', async (t) => {
  const log = createLogger('silent');
  const config = testConfig({ BOXHOST_PROJECT_PREFIX: '29' });
  t.teardown(() => cleanupHost(config));
  const call = (h: { url?: string; adminToken: string }, method: string, path: string, body?: object) => request(h.url!, method, path, h.adminToken, { body });
  let host = await startHost(config, { roles: ['api', 'node'], log });
  const made = await call(host, 'POST', `${P}/keep/boxes?wait=120`, { name: 'kept', config: SMALL });
  t.equal(made.status, 200, made.text);
  await host.close();

  const env = { BOXHOST_DATA_DIR: config.dataDir, BOXHOST_BOX_SUBNET: config.boxSubnet, BOXHOST_CLUSTER_SECRET: config.clusterSecret!, BOXHOST_PORT: '0', BOXHOST_AGENT_PORT: '0', BOXHOST_PROXY_PORT: '0', LOG_LEVEL: 'warn', BOXHOST_STORAGE_OVERCOMMIT: '100' };
  const moved = loadConfig({ ...env, BOXHOST_PROJECT_PREFIX: '26' }, { readDotenv: false });
  const refused = await startHost(moved, { roles: ['api', 'node'], log }).then(async (h) => {
    await h.close();
    return null;
  }, (e: unknown) => e);
  t.ok(refused instanceof ConfigError, 'another prefix: the node refuses to start (as on a bad variable: exit 2)');
  t.equal((refused as Error | null)?.message, `this node's box networks were laid out with BOXHOST_BOX_SUBNET=${config.boxSubnet} BOXHOST_PROJECT_PREFIX=29 (recorded in ${config.dataDir}/cni/layout.json), ` +
      `and 1 box holds addresses there; it is now set to BOXHOST_BOX_SUBNET=${config.boxSubnet} BOXHOST_PROJECT_PREFIX=26, which would move them. ` +
      'Set BOXHOST_BOX_SUBNET and BOXHOST_PROJECT_PREFIX back to the recorded values (widening BOXHOST_BOX_SUBNET from the same first address is allowed), or delete this node\'s boxes first');

  host = await startHost(config, { roles: ['api', 'node'], log });
  const kept = await call(host, 'GET', `${P}/keep/boxes/kept`);
  t.match(kept.body, { status: 'running', address: made.body.address }, 'back on the recorded layout: the box runs on, at its address');
  t.equal((await call(host, 'DELETE', `${P}/keep/boxes/kept?wait=120`)).status, 204);
  await host.close();

  const emptied = await startHost(moved, { roles: ['api', 'node'], log });
  t.pass('with no box left, the node takes the new layout');
  await emptied.close();
});
