import t from 'tap';
import { NetLayout } from '../core/netblocks';
import { startTestHost } from './helpers/host';
import { hostInventory, rowCounts } from './helpers/hostState';
import { Profiler } from '../bench/profile';

/**
 * Issue 13's scale: 260 boxes in one project on one node (past the 253 a project's /24 used to
 * hold), created 20 at a time through the HTTP API, all running at distinct addresses of the
 * project's block; the next one past a limit (here the project's boxes quota, set to the count)
 * is refused up front, before any row or job; then all deleted 20 at a time, leaving nothing on
 * the host. BOXHOST_TEST_SCALE_BOXES runs it with another count: 300 took 6.5 minutes of the
 * suite and 600 took 7 to 14 on the 2-core build machine (each batch slower as zfs-fuse holds
 * more mounts), so the suite proves the limit with the fewest that pass it, and
 * `npm run bench` (bench/scale.ts) measures 1000.
 */
const N = Number(process.env.BOXHOST_TEST_SCALE_BOXES ?? 260);
const BATCH = 20;
/** Generous bounds, for a run that has gone wrong rather than slow: on the 2-core build
 *  machine creating 600 took 4–7 minutes and deleting them as long, plus up to 4 more when
 *  zfs-fuse hangs under the load and the storage watchdog restarts it (every running box is
 *  started again then). */
const CREATE_BUDGET_MS = 12 * 60_000;
const BUDGET_MS = 20 * 60_000;
// Past the suite's 10-minute file timeout when the storage has to be restarted.
t.setTimeout(BUDGET_MS + 5 * 60_000);
const P = '/v1/projects';

t.test(`${N} boxes in one project on one node`, async (t) => {
  const started = Date.now();
  // Every host command the node runs is timed (bench/profile.ts), so that a slow batch says
  // where its time went: alone this file creates its 260 in 20 s, after the suite's first phase
  // it once took 225 s, one batch 110 s of it.
  const profiler = new Profiler();
  profiler.installCommandProbe();
  // The smallest boxes, and a node that may promise N of them: 1 cpu each on 2 × 1000, 64 MB
  // each on the machine's RAM × 4, 1 GB each on an 8 GB sparse pool × 100 (the test default).
  const host = await startTestHost(t, { BOXHOST_CPU_OVERCOMMIT: '1000', BOXHOST_RAM_OVERCOMMIT: '4', BOXHOST_WORKER_CONCURRENCY: String(BATCH) });
  const layout = new NetLayout(host.config.boxSubnet, host.config.projectPrefix);
  const SMALL = { cpus: 1, ram_mb: 64, storage_gb: 1 };
  const name = (i: number) => `s${String(i).padStart(3, '0')}`;
  const batches = (from: number, to: number) => Array.from({ length: Math.ceil((to - from) / BATCH) }, (_, b) => Array.from({ length: Math.min(BATCH, to - from - b * BATCH) }, (_, i) => from + b * BATCH + i));
  const timings: Record<string, number> = {};
  const timed = async <T>(what: string, fn: () => Promise<T>): Promise<T> => {
    const t0 = Date.now();
    try {
      return await fn();
    } finally {
      timings[what] = Date.now() - t0;
      t.comment(`${what}: ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    }
  };
  const set = await host.call('PUT', `${P}/scale`, { body: { quotas: { boxes: N } } });
  t.equal(set.status, 200, set.text);

  const batchMs: number[] = [];
  await timed(`create ${N}, ${BATCH} at a time`, async () => {
    for (const [b, batch] of batches(0, N).entries()) {
      profiler.phase = `create batch ${b}`;
      const t0 = Date.now();
      const res = await Promise.all(batch.map((i) => host.call('POST', `${P}/scale/boxes?wait=300`, { body: { name: name(i), config: SMALL } })));
      const bad = res.filter((r) => r.status !== 200 || r.body.status !== 'running');
      if (bad.length) {
        t.fail(`batch from ${name(batch[0])}: ${bad.length} not running: ${bad.slice(0, 3).map((r) => `${r.status} ${r.text.slice(0, 300)}`).join(' | ')}`);
        return;
      }
      batchMs.push(Date.now() - t0);
    }
    t.pass(`all ${N} created and running`);
  });
  const sorted = [...batchMs].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  t.comment(`create batches of ${BATCH}: first ${batchMs[0]} ms, median ${median} ms, last ${batchMs[batchMs.length - 1]} ms, slowest ${sorted[sorted.length - 1]} ms; each (s): ${batchMs.map((ms) => (ms / 1000).toFixed(1)).join(' ')}`);
  // A batch three times the median or more: its slowest host commands, and what the storage
  // watchdog said meanwhile (a hung zfs-fuse it restarted, or one that came back by itself).
  const slowBatches = [...batchMs.entries()].filter(([, ms]) => ms >= 3 * median);
  for (const [b, ms] of slowBatches) {
    const slow = profiler.samples.filter((x) => x.phase === `create batch ${b}`).sort((x, y) => y.ms - x.ms).slice(0, 6);
    t.comment(`batch ${b} (${(ms / 1000).toFixed(1)} s), its slowest host commands: ${slow.map((x) => `${x.label} ${(x.ms / 1000).toFixed(1)} s`).join(', ') || 'no host command'}`);
  }
  if (slowBatches.length) {
    const said = host.logs.filter((l) => typeof l.msg === 'string' && /storage|zfs-fuse/i.test(l.msg)).map((l) => `${new Date(l.time).toISOString().slice(11, 19)} ${l.msg}`);
    t.comment(`the storage watchdog: ${said.join('; ') || 'said nothing'}`);
  }
  t.ok(timings[`create ${N}, ${BATCH} at a time`] < CREATE_BUDGET_MS, `created within ${CREATE_BUDGET_MS / 60_000} minutes`);

  await t.test('all run, each at its own address of the project block', async (t) => {
    const list = await host.call('GET', `${P}/scale/boxes?max_results=1000`);
    t.equal(list.status, 200);
    const boxes = list.body.boxes as { name: string; status: string; address: string; node: string }[];
    t.equal(boxes.length, N);
    t.same(boxes.filter((b) => b.status !== 'running').map((b) => `${b.name}: ${b.status}`), [], 'every one running');
    t.equal(new Set(boxes.map((b) => b.address)).size, N, 'distinct addresses');
    const index = Number((await host.db('projects').where({ name: 'scale' }).first()).net_index);
    t.same(boxes.filter((b) => !layout.holds(index, b.address)).map((b) => b.address), [], `all in ${layout.block(index).cidr}`);
    t.same([...new Set(boxes.map((b) => b.node))], ['local']);
    t.equal((await hostInventory(host.config)).leases.length, N, 'as many leases on the node');
  });

  await t.test('the next one is refused up front, with no operation', async (t) => {
    const before = await rowCounts(host.db);
    const next = await host.call('POST', `${P}/scale/boxes?wait=60`, { body: { name: 'one-more', config: SMALL } });
    t.equal(next.status, 429, next.text);
    t.same(next.body, {
      error: { code: 'rate_limited', message: `project scale is at its quota: boxes ${N} of ${N} used, 1 more asked`, details: [{ field: 'quota.boxes', issue: `over the project's quota of ${N}` }] },
    });
    t.same(await rowCounts(host.db), before, 'no box row, no operation');
  });

  profiler.phase = 'delete';
  await timed(`delete ${N}, ${BATCH} at a time`, async () => {
    for (const batch of batches(0, N)) {
      const res = await Promise.all(batch.map((i) => host.call('DELETE', `${P}/scale/boxes/${name(i)}?wait=300`)));
      const bad = res.filter((r) => r.status !== 204);
      if (bad.length) {
        t.fail(`batch from ${name(batch[0])}: ${bad.length} not deleted: ${bad.slice(0, 3).map((r) => `${r.status} ${r.text.slice(0, 300)}`).join(' | ')}`);
        return;
      }
    }
    t.pass(`all ${N} deleted`);
  });

  await t.test('nothing is left', async (t) => {
    t.same((await host.call('GET', `${P}/scale/boxes`)).body.boxes, []);
    t.equal((await rowCounts(host.db)).boxes, 0);
    t.same(await hostInventory(host.config), { datasets: [], containers: [], netns: [], leases: [] });
  });

  const total = Date.now() - started;
  t.comment(`whole run (host start to last check): ${(total / 1000).toFixed(1)} s; ${JSON.stringify(Object.fromEntries(Object.entries(timings).map(([k, v]) => [k, Math.round(v / 100) / 10])))}`);
  t.ok(total < BUDGET_MS, `the whole run within ${BUDGET_MS / 60_000} minutes (${(total / 1000).toFixed(0)} s)`);
});
