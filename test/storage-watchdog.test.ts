import fs from 'node:fs';
import t, { type Test } from 'tap';
import { startTestHost, testConfig, testDataDir, TestHost } from './helpers/host';
import { ZfsStorage } from '../workers/storage/zfs';
import { fuseMountsOf } from '../workers/storage/hostFs';
import { run, sleep } from '../core/command';
import { ZFS_FUSE_PIDFILE, zfsFuseServes } from '../workers/storage/zfsFuse';
import { RECOVERING_REASON } from '../workers/storageRecovery';
import { settleWithin } from '../core/timeout';

/**
 * The storage daemon (zfs-fuse, shared by the whole machine) killed, then hung, with boxes
 * running: the node's storage watchdog notices, restarts it, and brings the boxes back by itself
 * within 60 s; a file synced before is intact; /healthz is 200 again. Nothing here restarts
 * anything by hand.
 */
const daemonPid = () => Number(fs.readFileSync(ZFS_FUSE_PIDFILE, 'utf8').trim());

/** Stops the daemon (SIGSTOP: every storage call blocks) until the test ends, unless the node
 *  replaces it first; checks ZFS gives no answer. Its pid. */
async function hangDaemon(t: Test): Promise<number> {
  const pid = daemonPid();
  process.kill(pid, 'SIGSTOP');
  t.teardown(() => {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // killed by the node, as it should be
    }
  });
  // Positive control.
  const probe = await run(['zpool', 'list'], { allowFailure: true, timeoutMs: 2000 }).catch((e: Error) => ({ exitCode: -1, stderr: e.message }));
  t.equal(probe.exitCode, null, 'control: `zpool list` gives no answer while the daemon is stopped (killed at 2 s)');
  return pid;
}

t.test('the storage watchdog brings a dead or hung storage daemon back, with the boxes on it', async (t) => {
  // Looks every second; no answer for 8 s counts as hung. A heartbeat every 30 s: what the node
  // row says of its storage during and right after a recovery comes from the recovery itself.
  const host = await startTestHost(t, { BOXHOST_STORAGE_WATCHDOG_SECS: '1', BOXHOST_STORAGE_HANG_SECS: '8', BOXHOST_HEARTBEAT_SECS: '30', BOXHOST_NODE_TIMEOUT_SECS: '300' });
  const P = '/v1/projects/wd/boxes';
  const exec = (name: string, command: string[]) => host.call('POST', `${P}/${name}/exec`, { body: { command, timeout_secs: 20 } });
  for (const name of ['a', 'b']) t.equal((await host.call('POST', `${P}?wait=120`, { body: { name } })).body.status, 'running', `box ${name} runs`);
  const wrote = await exec('a', ['sh', '-c', 'echo synced-before | dd of=/root/data conv=fsync 2>/dev/null && cat /root/data']);
  // Synced by the descriptor that wrote it (zfs-fuse ignores an fsync through another open of
  // the file, as `sync FILE` does: docs/decisions.md "Storage watchdog").
  t.equal(wrote.body.stdout, 'synced-before\n', 'a file written and fsynced in box a');

  const restarts = async () => (await host.call('GET', `/v1/nodes/${host.config.nodeId}`)).body.storage_restarts as number;
  t.equal(await restarts(), 0, 'no restart yet');

  const recovered = async (t: Test, how: string, n: number) => {
    const t0 = Date.now();
    let healthy = false;
    let ok = false;
    let sawReason = false;
    let sawUnhealthy = false;
    let healthyAt = 0;
    let lastRead = '';
    while (Date.now() - t0 < 60_000) {
      const [h, box] = await Promise.all([host.call('GET', '/healthz', { token: null }), host.call('GET', `${P}/a`)]);
      if (box.body?.error === RECOVERING_REASON) sawReason = true;
      healthy = h.status === 200;
      if (!healthy && h.body?.checks?.storage === 'error') sawUnhealthy = true;
      if (healthy && sawUnhealthy && !healthyAt) healthyAt = Date.now();
      if (healthy && box.body?.status === 'running' && box.body?.error === null) {
        const r = await exec('a', ['cat', '/root/data']);
        lastRead = r.text;
        ok = r.body?.stdout === 'synced-before\n';
        if (ok) break;
      }
      await sleep(sawReason ? 250 : 100); // the reason shows for a few seconds: looked at often until seen
    }
    const s = (Date.now() - t0) / 1000;
    t.comment(`${how}: node healthy and box a answering again ${s.toFixed(1)} s after the daemon was ${how}${sawReason ? ' (box a showed why meanwhile)' : ''}`);
    t.ok(sawReason, `${how}: meanwhile box a showed why it was not answering (its error: the storage restart)`);
    if (!healthy || !ok) {
      // What the node said meanwhile, for whoever reads a failed run.
      const said = host.logs.filter((l) => Number(l.time) >= t0 - 30_000 && Number(l.level) >= 30).slice(-80);
      t.comment(`${how}: the node's log since the daemon went:\n${said.map((l) => JSON.stringify(l).slice(0, 600)).join('\n')}`);
    }
    t.ok(healthy, `${how}: /healthz 200 again within 60 s`);
    t.ok(ok, `${how}: box a runs and its synced file is intact within 60 s (last read: ${lastRead.slice(0, 300)})`);
    for (const name of ['a', 'b']) {
      const box = (await host.call('GET', `${P}/${name}`)).body;
      t.equal(box.status, 'running', `${how}: box ${name} is running`);
      t.equal(box.error, null, `${how}: and shows no error`);
      t.equal((await exec(name, ['hostname'])).body.stdout, `${name}\n`, `${how}: box ${name} answers an exec`);
    }
    t.equal(await restarts(), n, `${how}: the node counted the restart`);
    const metrics = (await host.call('GET', '/metrics')).text;
    t.match(metrics, new RegExp(`boxhost_node_storage_restarts\\{node="${host.config.nodeId}"\\} ${n}\\b`), `${how}: and says so in /metrics`);
    const node = (await host.call('GET', `/v1/nodes/${host.config.nodeId}`)).body;
    t.equal(node.storage, 'ok', `${how}: the node reports its storage ok`);
    t.ok(host.logs.some((l) => /storage (died|hung)/.test(String(l.msg))), `${how}: the watchdog logged what it saw`);
    const done = host.logs.filter((l) => l.msg === 'storage recovery done');
    t.ok(done.length >= n, `${how}: and the recovery`);
    // Placement reads the node row: it says `error` while the node recovers and `ok` as soon as
    // it is done, not a heartbeat (30 s here) later.
    t.ok(sawUnhealthy, `${how}: /healthz said the storage was failing while the node recovered`);
    const lag = healthyAt - Number(done[done.length - 1]?.time);
    t.ok(healthyAt > 0 && lag < 5000, `${how}: and healthy again within 5 s of the recovery's end (${healthyAt ? `${lag} ms` : 'not seen'})`);
    // A new box and a delete work on the restarted storage.
    t.equal((await host.call('POST', `${P}?wait=120`, { body: { name: `after-${n}` } })).body.status, 'running', `${how}: a new box can be made`);
    t.equal((await host.call('DELETE', `${P}/after-${n}?wait=120`)).status, 204, `${how}: and deleted`);
  };

  t.test('kill -9 of the daemon', async (t) => {
    const pid = daemonPid();
    process.kill(pid, 'SIGKILL');
    // Positive control: the box really lost its root (a read fails) before the watchdog acts.
    const during = await exec('a', ['cat', '/root/data']);
    t.not(during.body?.stdout, 'synced-before\n', `control: the box could not read its file while the daemon was dead (${during.status} ${during.text.slice(0, 120)})`);
    await recovered(t, 'killed', 1);
    t.not(daemonPid(), pid, 'a new daemon runs');
  });

  t.test('kill -STOP of the daemon (hung: every storage call blocks)', async (t) => {
    const pid = await hangDaemon(t);
    await recovered(t, 'hung', 2);
    t.not(daemonPid(), pid, 'the hung daemon was replaced');
  });
});

/**
 * A node that starts while the daemon is hung has no watchdog yet: its start notices the
 * commands that give no answer, restarts the daemon and starts (workers/storage/zfsPool.ts init),
 * whether the daemon hung before its pool was made or after (the restarted daemon mounts nothing
 * by itself: the start mounts it).
 */
for (const when of ['before its pool was made', 'with its pool made and mounted']) {
  t.test(`a node that starts on a storage daemon hung ${when} restarts it and starts`, async (t) => {
    const env: Record<string, string> = { BOXHOST_STORAGE_WATCHDOG_SECS: '1', BOXHOST_STORAGE_HANG_SECS: '3' };
    if (when !== 'before its pool was made') {
      // The pool and its layout, made by the node's own driver on the data dir it starts on.
      env.BOXHOST_DATA_DIR = testDataDir();
      const config = testConfig(env);
      const made = new ZfsStorage({ dataDir: config.dataDir, poolSizeGb: config.poolSizeGb, hostTag: config.hostTag });
      await made.init();
      t.ok(fuseMountsOf(made.pool).length > 0, `control: the pool ${made.pool} is mounted before the daemon hangs`);
    }
    const pid = await hangDaemon(t);
    // A command with no answer for 2 × 3 s counts as hung while the node starts.
    const host = await startTestHost(t, env);
    t.not(daemonPid(), pid, 'the hung daemon was replaced');
    t.ok(
      host.logs.some((l) => /gave no answer .* while the node started: restarting zfs-fuse/.test(String(l.msg))),
      'the node logged why it restarted the daemon',
    );
    t.equal((await host.call('GET', '/healthz', { token: null })).status, 200, '/healthz answers 200');
    t.equal((await host.call('GET', `/v1/nodes/${host.config.nodeId}`)).body.storage, 'ok', 'the node reports its storage ok');
    const P = '/v1/projects/wd/boxes';
    t.equal((await host.call('POST', `${P}?wait=120`, { body: { name: 'c' } })).body.status, 'running', 'a box can be made on the restarted storage');
    const r = await host.call('POST', `${P}/c/exec`, { body: { command: ['hostname'] } });
    t.equal(r.body.stdout, 'c\n', 'and answers an exec');
    t.equal((await host.call('DELETE', `${P}/c?wait=120`)).status, 204, 'and is deleted');
  });
}

/**
 * zfs-fuse passes each new mount to its FUSE threads through one pipe in two writes; two mounts
 * at once could interleave them and wedge every FUSE request of the machine for good (zfsCommon.ts
 * ZFS_FUSE_MOUNT_LOCK says how; two CI runs failed on it). Sixteen box roots cloned at once, round
 * after round, through the driver with room for all sixteen commands at once: each clone takes
 * its turn on the machine-wide mount lock, so at most one `zfs clone` runs at any moment, and the
 * pool answers a statfs after every round. (By hand, 16 raw `zfs create`s at once wedged the
 * daemon within 50 rounds in 2 of 5 tries; with the lock, none in 7 tries of 30 to 50 rounds.)
 */
t.test("box roots cloned at once take turns mounting: zfs-fuse's FUSE threads never wedge", { skip: zfsFuseServes() ? false : 'kernel ZFS: mounts need no turns' }, async (t) => {
  const dataDir = testDataDir();
  const hostTag = `mnt${process.pid.toString(36)}`;
  const storage = new ZfsStorage({ dataDir, poolSizeGb: 2, hostTag, concurrency: 16 });
  await storage.init();
  t.teardown(async () => {
    await storage.destroyPool();
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
  const base = { name: 'tiny', version: 'v1' };
  await storage.createBase(base, async (dir) => fs.writeFileSync(`${dir}/hello`, 'hi\n'));
  // What runs: every `zfs clone` process alive, sampled every few milliseconds from /proc.
  let most = 0;
  let sampling = true;
  t.teardown(() => void (sampling = false));
  const sampler = (async () => {
    while (sampling) {
      let clones = 0;
      for (const pid of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(pid)) continue;
        try {
          const argv = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
          if (/(^|\/)zfs$/.test(argv[0]) && argv[1] === 'clone' && argv.includes(`${storage.pool}/bases/tiny/v1@base`)) clones++;
        } catch {
          // gone meanwhile
        }
      }
      most = Math.max(most, clones);
      await sleep(3);
    }
  })();
  const mnt = `${dataDir}/zfs/mnt`;
  const rounds = 10;
  let answered = 0;
  for (let round = 0; round < rounds; round++) {
    await Promise.all(Array.from({ length: 16 }, (_, i) => storage.createBoxRoot(`m${round}x${i}`, { kind: 'base', base })));
    // (A statfs of a wedged FUSE mount may never return, even killed: waited on at most 10 s.)
    const st = await settleWithin(run(['stat', '-f', mnt], { timeoutMs: 10_000, allowFailure: true }), 12_000, null);
    if (st?.exitCode !== 0) break;
    answered++;
  }
  sampling = false;
  await sampler;
  t.equal(answered, rounds, `the pool answered a statfs after each of ${rounds} rounds of 16 clones at once`);
  t.equal(most, 1, `at most one \`zfs clone\` ran at any moment (most seen at once: ${most})`);
  const roots = await storage.listBoxRoots();
  t.equal(roots.filter((r) => /^m\d+x\d+$/.test(r)).length, rounds * 16, 'every root was made');
  t.equal(fs.readFileSync(`${storage.boxRootPath('m9x15')}/hello`, 'utf8'), 'hi\n', 'and the last one made reads its base');
});
