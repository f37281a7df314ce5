import fs from 'node:fs';
import t from 'tap';
import { run, sleep } from '../core/command';
import { BoxdServices } from '../workers/runtime/boxd/services';
import type { RuncRuntime } from '../workers/runtime/runc';
import { startTestHost } from './helpers/host';

/**
 * A box whose boxd stops answering (PID 1 frozen from the host, SIGSTOP: what a wedged agent
 * looks like to its node) or whose boxd is gone (PID 1 killed from the host) is noticed by the
 * node's agent watchdog and restarted, on the real tools, with its enabled services back.
 * Nothing here restarts anything by hand.
 */
t.test('the agent watchdog restarts a box whose boxd is wedged or gone', async (t) => {
  const host = await startTestHost(t, { BOXHOST_AGENT_CHECK_SECS: '0.5', BOXHOST_AGENT_TIMEOUT_SECS: '1' });
  const runtime = host.node!.ctx.runtime as RuncRuntime;
  const dog = host.node!.agentWatchdog!;
  const P = '/v1/projects/rec/boxes';
  const box = (await host.call('POST', `${P}?wait=120`, { body: { name: 'w' } })).body;
  t.equal(box.status, 'running');
  // A short grace: a wedged boxd answers no stop, so the restart waits it out before SIGKILL.
  t.equal((await host.call('PUT', `${P}/w`, { body: { termination_grace_period_seconds: 2 } })).status, 200);
  const exec = (command: string[]) => host.call('POST', `${P}/w/exec`, { body: { command, timeout_secs: 10 } });
  const svc = await new BoxdServices((await runtime.agent(box.id))!).start({ name: 'keeper', command: ['sleep', '100000'] });
  t.equal(svc.service.state, 'running', 'a service runs in the box');
  const pid1 = async () => JSON.parse((await run(['runc', '--root', runtime.root, 'state', runtime.containerId(box.id)])).stdout).pid as number;

  const recovers = async (how: string, before: number) => {
    const t0 = Date.now();
    let ok = false;
    while (Date.now() - t0 < 30_000) {
      const r = await exec(['echo', 'back']).catch(() => null);
      if (r?.status === 200 && r.body.stdout === 'back\n' && dog.restarted.length === before + 1) {
        ok = true;
        break;
      }
      await sleep(200);
    }
    t.ok(ok, `${how}: the box answers an exec again within 30 s (${((Date.now() - t0) / 1000).toFixed(1)} s), restarted once by the watchdog`);
    t.equal(dog.restarted[before], box.id);
    const ops = await host.db('operations').where({ box_id: box.id, kind: 'box.recover' }).orderBy('seq');
    t.same(ops.map((o: { status: string }) => o.status), Array(before + 1).fill('succeeded'), `${how}: the restart is an operation of the box, succeeded`);
    t.equal((await host.call('GET', `${P}/w`)).body.status, 'running', `${how}: the box is running`);
    const back = await new BoxdServices((await runtime.agent(box.id))!).get('keeper');
    t.equal(back.state, 'running', `${how}: its service came back with it`);
  };

  // Out of reach for a moment (its socket moved aside on the host, for less than the watchdog's
  // three misses): the API answers 503 with Retry-After and the contract's body, with no host
  // path in it; put back, the same boxd serves again, and nothing was restarted.
  // Each call in a window of its own, as short as the call (a missing socket is refused at once),
  // so the watchdog sees at most one miss in a row.
  const sock = runtime.boxdSocketPath(box.id);
  const whileAway = async <T>(call: () => Promise<T>): Promise<T> => {
    fs.renameSync(sock, `${sock}.away`);
    try {
      return await call();
    } finally {
      fs.renameSync(`${sock}.away`, sock);
    }
  };
  const away = await whileAway(() => exec(['true']));
  const awayFile = await whileAway(() => host.call('GET', `${P}/w/files?path=/etc/hostname`));
  for (const [what, r] of [['exec', away], ['a file read', awayFile]] as const) {
    t.equal(r.status, 503, `${what} while boxd is out of reach: 503`);
    t.equal(r.headers.get('retry-after'), '5', `${what}: with Retry-After`);
    t.equal(r.body?.error?.code, 'unavailable', `${what}: the contract's error body`);
    t.match(r.body?.error?.message, /boxd/, `${what}: naming the box's agent`);
    t.notMatch(r.text, /\/var\/|\/tmp\/|\/run\/|\.sock/, `${what}: no host path`);
  }
  t.equal((await exec(['echo', 'again'])).body.stdout, 'again\n', 'back: it serves again');
  t.equal(dog.restarted.length, 0, 'without a restart');

  const frozen = await pid1();
  await run(['kill', '-STOP', String(frozen)]);
  await recovers('wedged (SIGSTOP)', 0);
  t.not(await pid1(), frozen, 'a new boxd');
  // Gone, or a zombie its reaper has not collected yet (the machine's own PID 1 here reaps late).
  const state = (await run(['sh', '-c', `cut -d' ' -f3 /proc/${frozen}/stat 2>/dev/null || echo gone`])).stdout.trim();
  t.ok(state === 'gone' || state === 'Z', `the frozen one is dead (${state})`);

  await run(['kill', '-KILL', String(await pid1())]);
  await recovers('gone (SIGKILL of PID 1)', 1);
  await sleep(1500);
  t.equal(dog.restarted.length, 2, 'a healthy box is left alone');
});
