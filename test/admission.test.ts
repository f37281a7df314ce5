import fs from 'node:fs';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { projectsRepo } from '../db/repos/projects';
import type { CniNetwork } from '../workers/network/cni';

/**
 * Capacity admission and project quotas on a real host: a node promises at most its capacity ×
 * its overcommit ratios (storage past it → 507, cpu/RAM → 409), a project at most its quotas
 * (→ 429 with Retry-After), and a refused create leaves nothing behind.
 */
t.test('admission and quotas', async (t) => {
  // 2 cpus × 2 = 4 promisable; 2048 MB × 1 of RAM; an 8 GB pool × 1 (≈ 7 GB once ZFS takes its share).
  const host = await startTestHost(t, { BOXHOST_NODE_CPUS: '2', BOXHOST_CPU_OVERCOMMIT: '2', BOXHOST_NODE_RAM_MB: '2048', BOXHOST_RAM_OVERCOMMIT: '1', BOXHOST_STORAGE_OVERCOMMIT: '1' });
  const P = '/v1/projects';
  const counts = async () => ({
    boxes: Number((await host.db('boxes').count({ n: '*' }))[0].n),
    ops: Number((await host.db('operations').count({ n: '*' }))[0].n),
  });
  const node = (await host.call('GET', '/v1/nodes/local')).body;
  t.match(node.allocatable, { cpus: 4, ram_mb: 2048 });
  t.ok(node.allocatable.disk_gb >= 6 && node.allocatable.disk_gb <= 8, `the pool's room: ${node.allocatable.disk_gb} GB`);

  t.test('the node refuses what it cannot promise; nothing is made', async (t) => {
    const before = await counts();
    const disk = await host.call('POST', `${P}/adm/boxes`, { body: { name: 'huge', config: { storage_gb: node.allocatable.disk_gb + 1 } } });
    t.equal(disk.status, 507, 'storage past the pool → 507');
    t.equal(disk.body.error.code, 'insufficient_storage');
    t.match(disk.body.error.message, /node local has 0 of \d+ GB storage promised/);
    t.same(disk.body.error.details, [{ field: 'config.storage_gb', issue: 'no node has room for it' }]);
    const ram = await host.call('POST', `${P}/adm/boxes`, { body: { name: 'fat', config: { ram_mb: 4096 } } });
    t.equal(ram.status, 409, 'RAM past the node → 409');
    t.equal(ram.body.error.code, 'conflict');
    t.same(await counts(), before, 'no box row, no operation');

    const a = await host.call('POST', `${P}/adm/boxes?wait=60`, { body: { name: 'a', config: { ram_mb: 1536, cpus: 2, storage_gb: 1 } } });
    t.equal(a.status, 200, a.text);
    const b = await host.call('POST', `${P}/adm/boxes`, { body: { name: 'b', config: { ram_mb: 1024, storage_gb: 1 } } });
    t.equal(b.status, 409, 'what is promised counts: 1536 + 1024 > 2048');
    const cpu = await host.call('POST', `${P}/adm/boxes`, { body: { name: 'c', config: { cpus: 3, ram_mb: 128, storage_gb: 1 } } });
    t.equal(cpu.status, 409, 'cpus count too: 2 + 3 > 4 promisable');
    t.same(cpu.body.error.details, [{ field: 'config.cpus', issue: 'no node has room for it' }]);
    const fork = await host.call('POST', `${P}/adm/boxes`, { body: { name: 'a-fork', fork: 'a' } });
    t.equal(fork.status, 409, "a fork takes its source's config (1536 MB) and needs room on its node");
    const grow = await host.call('PUT', `${P}/adm/boxes/a`, { body: { config: { ram_mb: 4096 } } });
    t.equal(grow.status, 409, 'growing past the node is refused');
    t.equal((await host.call('GET', `${P}/adm/boxes/a`)).body.config.ram_mb, 1536, 'and changes nothing');
    t.equal((await host.call('PUT', `${P}/adm/boxes/a`, { body: { config: { ram_mb: 1024 } } })).status, 200, 'shrinking is fine');
    t.equal((await host.call('POST', `${P}/adm/boxes?wait=60`, { body: { name: 'b', config: { ram_mb: 1024, storage_gb: 1 } } })).status, 200, 'and makes room');
    t.match((await host.call('GET', '/v1/nodes/local')).body.committed, { cpus: 3, ram_mb: 2048, disk_gb: 2, boxes: 2 });
    // The project's bridge lives while it has a box on the node and goes with the last one.
    const bridge = (host.node!.ctx.network as CniNetwork).bridgeName((await projectsRepo.get(host.db, 'adm'))!.net_index);
    t.ok(fs.existsSync(`/sys/class/net/${bridge}`), `control: the project's bridge ${bridge} is there`);
    t.equal((await host.call('DELETE', `${P}/adm/boxes/a?wait=60`)).status, 204);
    t.ok(fs.existsSync(`/sys/class/net/${bridge}`), 'one box left: the bridge stays');
    t.equal((await host.call('DELETE', `${P}/adm/boxes/b?wait=60`)).status, 204);
    t.notOk(fs.existsSync(`/sys/class/net/${bridge}`), 'the last box gone: so is the bridge');
  });

  t.test('a project holds at most its quotas: 429 with Retry-After', async (t) => {
    const set = await host.call('PUT', `${P}/quota`, { body: { quotas: { boxes: 1, cpus: 2 } } });
    t.equal(set.status, 200, 'quotas can be set before the first box');
    t.match(set.body, { name: 'quota', box_count: 0, quotas: { boxes: 1, cpus: 2, ram_mb: 1024 * 1024 }, usage: { boxes: 0, cpus: 0 } });
    t.equal((await host.call('POST', `${P}/quota/boxes?wait=60`, { body: { name: 'one', config: { ram_mb: 128, storage_gb: 1 } } })).status, 200);
    const before = await counts();
    const two = await host.call('POST', `${P}/quota/boxes`, { body: { name: 'two', config: { ram_mb: 128, storage_gb: 1 } } });
    t.equal(two.status, 429);
    t.equal(two.headers.get('retry-after'), '60');
    t.equal(two.body.error.code, 'rate_limited');
    t.match(two.body.error.message, /project quota is at its quota: boxes 1 of 1 used, 1 more asked/);
    t.same(two.body.error.details, [{ field: 'quota.boxes', issue: "over the project's quota of 1" }]);
    t.same(await counts(), before, 'nothing made');
    // 1 TB of RAM: no node has room for it (control: 409 in a project under its quotas); a
    // project at its quota hears of the quota instead, which it can act on.
    const noRoom = await host.call('POST', `${P}/noroom/boxes`, { body: { name: 'huge', config: { ram_mb: 1048576, storage_gb: 1 } } });
    t.equal(noRoom.status, 409, `control: no node has room for it (${noRoom.text})`);
    const huge = await host.call('POST', `${P}/quota/boxes`, { body: { name: 'huge', config: { ram_mb: 1048576, storage_gb: 1 } } });
    t.equal(huge.status, 429, `at its quota and past every node's room: the quota answers (${huge.text})`);
    t.match(huge.body.error.details, [{ field: 'quota.boxes' }]);
    t.same(await counts(), before, 'nothing made');
    const cpus = await host.call('PUT', `${P}/quota/boxes/one`, { body: { config: { cpus: 3 } } });
    t.equal(cpus.status, 429, 'an update past the cpu quota');
    t.same(cpus.body.error.details, [{ field: 'config.cpus', issue: "over the project's quota of 2" }]);
    t.match((await host.call('GET', `${P}/quota`)).body, { usage: { boxes: 1, cpus: 1, ram_mb: 128, storage_gb: 1, volumes: 0 } });
    // RAM and storage quotas, on a create (boxes lifted out of the way) and on an update.
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { boxes: 5, ram_mb: 256, storage_gb: 2 } } })).status, 200);
    const ram = await host.call('POST', `${P}/quota/boxes`, { body: { name: 'ram', config: { ram_mb: 256, storage_gb: 1 } } });
    t.equal(ram.status, 429, 'a create past the ram quota: 128 + 256 > 256');
    t.same(ram.body.error.details, [{ field: 'config.ram_mb', issue: "over the project's quota of 256" }]);
    const disk = await host.call('POST', `${P}/quota/boxes`, { body: { name: 'disk', config: { ram_mb: 64, storage_gb: 2 } } });
    t.equal(disk.status, 429, 'a create past the storage quota: 1 + 2 > 2');
    t.same(disk.body.error.details, [{ field: 'config.storage_gb', issue: "over the project's quota of 2" }]);
    const grown = await host.call('PUT', `${P}/quota/boxes/one`, { body: { config: { ram_mb: 512 } } });
    t.equal(grown.status, 429, 'an update past the ram quota');
    t.same(await counts(), before, 'nothing made');
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { ram_mb: null, storage_gb: null } } })).status, 200);
    // The volumes quota: a volume with no project joins the project of the box made with it.
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { volumes: 0 } } })).status, 200);
    t.equal((await host.call('POST', '/v1/data', { body: { name: 'qvol', size_gb: 1 } })).status, 201);
    const beforeVol = await counts();
    const withVol = await host.call('POST', `${P}/quota/boxes`, { body: { name: 'withvol', config: { ram_mb: 64, storage_gb: 1 }, data_mounts: [{ name: 'qvol', path: '/data' }] } });
    t.equal(withVol.status, 429, 'a box bringing a volume past the volumes quota');
    t.same(withVol.body.error.details, [{ field: 'quota.volumes', issue: "over the project's quota of 0" }]);
    t.same(await counts(), beforeVol, 'nothing made');
    t.equal((await host.call('GET', '/v1/data/qvol')).body.project, null, 'the volume joined no project');
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { volumes: null } } })).status, 200);
    t.ok([202, 204].includes((await host.call('DELETE', '/v1/data/qvol')).status), 'the volume deleted');
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { boxes: null } } })).body.quotas.boxes, 1000, 'null: back to the default');
    t.equal((await host.call('POST', `${P}/quota/boxes?wait=60`, { body: { name: 'two', config: { ram_mb: 128, storage_gb: 1 } } })).status, 200);
    const tok = (await host.call('POST', '/v1/tokens', { body: { name: 'q', projects: ['quota'] } })).body.token;
    t.equal((await host.call('PUT', `${P}/quota`, { token: tok, body: { quotas: { boxes: 5 } } })).status, 403, 'a project token cannot raise its own quotas');
    t.equal((await host.call('GET', `${P}/quota`, { token: tok })).status, 200, 'but can read them');
    t.equal((await host.call('GET', `${P}/adm`, { token: tok })).status, 404, 'and no other project');
    t.equal((await host.call('PUT', `${P}/quota`, { body: { quotas: { boxes: -1 } } })).status, 400);
    for (const n of ['one', 'two']) await host.call('DELETE', `${P}/quota/boxes/${n}?wait=60`);
  });
});
