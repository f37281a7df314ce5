import { execFileSync } from 'node:child_process';
import { Readable } from 'node:stream';
import t from 'tap';
import { BoxhostError } from '../core/errors';
import type { BoxRecord } from '../db/repos/boxes';
import { checkStart, toService } from '../domain/services';
import { serviceCommands, shellQuote } from '../domain/serviceCommands';
import { startService } from '../workers/agent/localServices';
import type { BoxServices, BoxServiceState } from '../workers/drivers';

/**
 * The logic of services without a box (docs/services.md): the start rules, the command lines
 * and their quoting (read back by a real sh), the record made from what a box reports, and the
 * ready gate's loop against a scripted supervisor.
 */

const failure = (f: () => unknown): BoxhostError => {
  try {
    f();
  } catch (e) {
    return e as BoxhostError;
  }
  throw new Error('expected a failure');
};

t.test('start rules', async (t) => {
  const base = { name: 'www', command: ['httpd'] };
  t.same(failure(() => checkStart({ ...base, env: { A: '1' }, secret_env: ['B'] })).details, [{ field: 'secret_env', issue: 'B is not a key of env' }]);
  t.equal(failure(() => checkStart({ ...base, publish: { name: 'x' } })).details[0].field, 'publish', 'publish needs port');
  t.equal(failure(() => checkStart({ ...base, ready: { http: '/' } })).details[0].field, 'ready.port', 'an http gate needs a port');
  t.equal(failure(() => checkStart({ ...base, ready: { http: '/', tcp: 80 } })).details[0].field, 'ready');
  t.equal(failure(() => checkStart({ ...base, ready: {} })).details[0].field, 'ready');
  t.equal(failure(() => checkStart({ ...base, port: 80, publish: { name: 'a--b' } })).details[0].field, 'publish.name', 'a publish name follows the name rule');
  t.same(checkStart({ ...base, port: 8080, ready: { http: '/healthz', status: 204 } }), { port: 8080, path: '/healthz', status: 204, timeoutMs: 30_000 }, 'the default timeout is 30 s');
  t.same(checkStart({ ...base, ready: { http: '/', port: 9000, timeout_secs: 5 } }), { port: 9000, path: '/', status: undefined, timeoutMs: 5000 }, 'ready.port wins');
  t.same(checkStart({ ...base, ready: { tcp: 5432 } }), { port: 5432, timeoutMs: 30_000 });
  t.equal(checkStart({ ...base, env: { A: '1' }, secret_env: ['A'] }), undefined, 'no gate');
});

t.test('commands: quoted for sh, secrets never written', async (t) => {
  for (const s of ['plain', 'with space', "it's", '$HOME', 'a"b', '`x`', '', 'ünï', '*', 'a\nb']) {
    t.equal(execFileSync('sh', ['-c', `printf %s ${shellQuote(s)}`]).toString(), s, `sh reads back ${JSON.stringify(s)}`);
  }
  const box = { name: 'web', project: 'demo' } as BoxRecord;
  const c = serviceCommands(box, { name: 'api', command: ['node', 'server.js', '--greeting', 'hi there'], env: { KEY: 'topsecret', MODE: 'prod' }, secret_env: ['KEY'], port: 3000, publish: { name: 'app', public: false }, restart: 'on-failure', user: 'app', cwd: '/srv/app' });
  t.notMatch(c.start, /topsecret/);
  t.equal(c.start, "box svc start web api -p demo --cwd /srv/app --user app --restart on-failure --port 3000 --env KEY --env MODE=prod --secret-env KEY --publish app --private -- node server.js --greeting 'hi there'");
  t.equal(c.publish, 'box svc publish web api -p demo');
  t.equal(c.unpublish, 'box svc unpublish web api -p demo');
});

t.test('the record: a tombstone, a spec with fields of the wrong type', async (t) => {
  const box = { name: 'web', project: 'demo' } as BoxRecord;
  t.match(toService(box, { name: 'bad', state: 'corrupt', pid: 0, restarts: 0, lastExitCode: null, error: 'not a JSON object' }), { name: 'bad', state: 'corrupt', error: 'not a JSON object', command: [] });
  const s = toService(box, { name: 'x', state: 'running', pid: 7, restarts: 2, lastExitCode: 1, spec: { name: 'x', command: ['a', 1], port: '80', tags: { a: 1 }, user: 5, restart: 'sometimes' } });
  t.same([s.command, s.port, s.tags, s.user, s.restart, s.last_exit_code], [[], 0, {}, 'root', 'always', 1], 'what the box wrote with another type is not believed');
});

/** A supervisor that answers as scripted: probes fail `failLooks` times, the state is `state`. */
function scripted(opts: { failLooks: number; state?: BoxServiceState['state']; exit?: number | null; log?: string }) {
  let looks = 0;
  const calls: string[] = [];
  const st = (): BoxServiceState => ({ name: 'www', state: opts.state ?? 'running', pid: 9, restarts: 0, lastExitCode: opts.exit ?? null });
  const services: BoxServices = {
    start: async () => (calls.push('start'), { service: st(), replaced: false }),
    resume: async () => st(),
    restart: async () => st(),
    stop: async (_n, o) => (calls.push(`stop:${o?.fail ?? ''}`), { ...st(), state: 'failed', pid: 0 }),
    get: async () => st(),
    list: async () => [st()],
    remove: async () => undefined,
    logs: async () => Readable.from([Buffer.from(opts.log ?? '')]),
    probe: async () => (++looks > opts.failLooks ? { ok: true } : { ok: false, issue: 'nothing accepts connections on port 8080' }),
  };
  return { services, calls, looks: () => looks };
}

t.test('the ready gate', async (t) => {
  const pass = scripted({ failLooks: 3 });
  const r = await startService(pass.services, { name: 'www', command: ['httpd'] }, { port: 8080, path: '/', timeoutMs: 5000 });
  t.equal(r.service.state, 'running');
  t.equal(pass.looks(), 4, 'looked until it passed');

  const slow = scripted({ failLooks: 1e9, log: `${Array.from({ length: 30 }, (_, i) => `line ${i}`).join('\n')}\n` });
  const t0 = Date.now();
  const e = (await startService(slow.services, { name: 'www', command: ['httpd'] }, { port: 8080, timeoutMs: 600 }).catch((x) => x)) as BoxhostError;
  t.ok(Date.now() - t0 >= 550, 'waited its time');
  t.equal(e.code, 'not_ready');
  t.same(e.details.map((d) => d.field), ['ready.tcp']);
  t.match(e.message, /line 29$/);
  t.notMatch(e.message, /line 9\n/, 'only the last 20 lines');
  t.match(slow.calls, ['start', /^stop:ready\.tcp: nothing accepts connections on port 8080 after 1 s$/], 'the service was stopped and marked failed');

  const gone = scripted({ failLooks: 1e9, state: 'failed', exit: 3 });
  const t1 = Date.now();
  const g = (await startService(gone.services, { name: 'www', command: ['false'] }, { port: 8080, path: '/', timeoutMs: 30_000 }).catch((x) => x)) as BoxhostError;
  t.ok(Date.now() - t1 < 15_000, 'a service that ended for good fails at once, not at the end of its 30 s gate');
  t.match(g.details[0], { field: 'ready.http', issue: /the service failed with exit code 3/ });
  t.match(g.message, /it wrote no output/);
});
