import path from 'node:path';
import { execFile, spawn } from 'node:child_process';
import t from 'tap';
import { startTestHost } from './helpers/host';

/**
 * Packs on a real host (docs/packs.md): install (JSON and YAML, validated to the field, the same
 * content twice changes nothing), list, get, delete (409 with instances); the pack form of base
 * builds; instances (their base built by the pack form, `pack` and `pack_rev` recorded, lifecycle
 * dev); verbs (declared env only, args appended) and the event each run records with every spec
 * field, env values never kept; env_from; the events list (filters, pages, project limits) and
 * stream (Server-Sent Events resumed with Last-Event-ID); the CLI.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');

const manifest = {
  name: 'kv',
  description: 'a tiny key-value box',
  default_rev: 'v1',
  revisions: {
    v1: {
      base: 'kv-base',
      parent: 'busybox',
      script: 'mkdir -p /srv/kv && echo kv-ready > /srv/kv/README',
      services: [{ name: 'web', command: ['httpd', '-f', '-p', '8080', '-h', '/srv/kv'], port: 8080, ready: { http: '/README', timeout_secs: 30 }, publish: { name: 'web' }, env: { KV_PASS: '{{secret.password}}' }, secret_env: ['KV_PASS'] }],
      verbs: {
        put: { command: ['sh', '-c', 'echo "$2" > /srv/kv/"$1" && echo stored "$1" by "${KV_USER:-nobody}"', 'put'], description: 'store a value', env: ['KV_USER'] },
        get: { command: ['cat'], description: 'print a file' },
        fail: { command: ['sh', '-c', 'echo no >&2; exit 3'] },
      },
      outputs: { HOST: '{{address}}', NAME: '{{name}}.{{project}}', KEEP: '{{unknown}}', PORT: '{{port.web}}', PUB: '{{host.web}}', PASS: '{{secret.password}}', NOPE: '{{port.nope}}' },
    },
  },
};

t.test('packs on a real host', async (t) => {
  const host = await startTestHost(t);
  const call = (method: string, p: string, body?: unknown, token?: string) => host.call(method, p, { body, ...(token !== undefined ? { token } : {}) });

  t.test('install: 201, validated to the field; the same content again changes nothing; YAML too', async (t) => {
    const r = await call('POST', '/v1/packs', manifest);
    t.equal(r.status, 201, r.text);
    t.match(r.body, { name: 'kv', description: 'a tiny key-value box', default_rev: 'v1', instances: 0 });
    t.match(r.body.rev, /^[0-9a-f]{12}$/);
    t.match(r.body.revisions.v1, { base: 'kv-base', parent: 'busybox', rev: /^[0-9a-f]{12}$/ });
    const again = await call('POST', '/v1/packs', { ...manifest, revisions: { v1: { ...manifest.revisions.v1 } } });
    t.equal(again.status, 201);
    t.equal(again.body.rev, r.body.rev, 'same content, same rev');
    t.equal(again.body.updated_at, r.body.updated_at, 'nothing changed');

    for (const [bad, field] of [
      [{ ...manifest, default_rev: 'v9' }, 'default_rev'],
      [{ ...manifest, name: 'Bad_Name' }, 'name'],
      [{ ...manifest, revisions: { v1: { ...manifest.revisions.v1, verbs: { put: { command: [] } } } } }, 'revisions.v1.verbs.put.command'],
      [{ ...manifest, revisions: { v1: { ...manifest.revisions.v1, verbs: { put: { command: ['x'], env: ['1BAD'] } } } } }, 'revisions.v1.verbs.put.env.0'],
      [{ ...manifest, revisions: { v1: { ...manifest.revisions.v1, services: [{ name: 'w', command: ['x'], secret_env: ['S'] }] } } }, 'revisions.v1.services.0.secret_env'],
      [{ ...manifest, revisions: {} }, 'revisions'],
    ] as const) {
      const b = await call('POST', '/v1/packs', bad);
      t.equal(b.status, 400, `400 for a bad ${field}`);
      t.equal(b.body.error.code, 'invalid_argument');
      t.ok(b.body.error.details.some((d: any) => d.field === field), `details name ${field}: ${JSON.stringify(b.body.error.details)}`);
    }

    const yaml = 'name: kv-yaml\ndefault_rev: a\nrevisions:\n  a:\n    base: kv-yaml-base\n    parent: busybox\n    script: "true"\n    verbs:\n      hello: {command: [echo, hello]}\n';
    const y = await fetch(`${host.url}/v1/packs`, { method: 'POST', headers: { authorization: `Bearer ${host.adminToken}`, 'content-type': 'application/yaml' }, body: yaml });
    t.equal(y.status, 201, 'a YAML manifest');
    t.same(Object.keys(((await y.json()) as any).revisions.a.verbs), ["hello"]);
    const broken = await fetch(`${host.url}/v1/packs`, { method: 'POST', headers: { authorization: `Bearer ${host.adminToken}`, 'content-type': 'application/yaml' }, body: 'name: [unclosed' });
    t.equal(broken.status, 400, 'YAML that does not parse');
    t.equal(((await broken.json()) as any).error.code, "invalid_argument");
    const bomb = 'a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n';
    const laughs = await fetch(`${host.url}/v1/packs`, { method: 'POST', headers: { authorization: `Bearer ${host.adminToken}`, 'content-type': 'application/yaml' }, body: bomb });
    t.equal(laughs.status, 400, 'a billion-laughs document is refused');

    for (const tagged of ['verbs: !!binary ""', 'outputs: !!timestamp 2001-12-14', 'verbs: !!omap [{put: {command: [x]}}]', 'verbs: !custom {}']) {
      const doc = `name: tagged\ndefault_rev: a\nrevisions:\n  a:\n    base: t-base\n    parent: busybox\n    script: "true"\n    ${tagged}\n`;
      const r = await fetch(`${host.url}/v1/packs`, { method: 'POST', headers: { authorization: `Bearer ${host.adminToken}`, 'content-type': 'application/yaml' }, body: doc });
      t.equal(r.status, 400, `a YAML tag is refused: ${tagged}`);
    }
    const big = `name: big\ndefault_rev: a\nx: &x "${'y'.repeat(100_000)}"\nrevisions:\n  a:\n    base: b-base\n    parent: busybox\n    script: "true"\n    outputs: {${Array.from({ length: 20 }, (_, i) => `K${i}: *x`).join(', ')}}\n`;
    const inflated = await fetch(`${host.url}/v1/packs`, { method: 'POST', headers: { authorization: `Bearer ${host.adminToken}`, 'content-type': 'application/yaml' }, body: big });
    t.equal(inflated.status, 413, 'aliases cannot inflate a manifest past the body limit');

    const list = (await call('GET', '/v1/packs')).body.packs;
    t.same(list.map((p: any) => p.name), ['kv', 'kv-yaml']);
    t.equal((await call('GET', '/v1/packs/nope')).status, 404);
    t.equal((await call('DELETE', '/v1/packs/kv-yaml')).status, 204);
    t.equal((await call('GET', '/v1/packs/kv-yaml')).status, 404);
  });

  t.test('create rules: lifecycle only dev and only with pack; an unknown pack; env_from only from instances', async (t) => {
    const cases: [object, string][] = [
      [{ name: 'x1', lifecycle: 'deploy', pack: 'kv' }, 'lifecycle'],
      [{ name: 'x2', lifecycle: 'dev' }, 'lifecycle'],
      [{ name: 'x3', pack: 'nope' }, 'pack'],
      [{ name: 'x4', pack: 'kv', base: 'busybox' }, 'base'],
      [{ name: 'x5', env_from: [{ alias: 'db', box: 'missing' }] }, 'env_from.0.box'],
    ];
    for (const [body, field] of cases) {
      const r = await call('POST', '/v1/projects/pk/boxes', body);
      t.equal(r.status, 400, `${JSON.stringify(body)} → 400`);
      t.equal(r.body.error.details[0]?.field, field);
    }
    t.equal((await call('GET', '/v1/projects/pk/boxes')).body.boxes.length, 0, 'no box was made');
  });

  let instanceRev = '';
  t.test("an instance: its base built by the pack form first, its create waiting for the build", async (t) => {
    // By a project-limited token: the pack's base is every project's, so its build runs where
    // that token cannot reach it.
    const pkToken = (await call('POST', '/v1/tokens', { name: 'pk-dev', projects: ['pk'] })).body.token;
    const first = await call('POST', '/v1/projects/pk/boxes', { name: 'kv1', pack: 'kv', lifecycle: 'dev' }, pkToken);
    t.equal(first.status, 202, first.text);
    t.match(first.body, { status: 'creating', pack: 'kv', lifecycle: 'dev' });
    const builds = (await call('GET', '/v1/projects/base-builds/boxes')).body.boxes;
    t.equal(builds.length, 1, 'the pack base is being built in a temporary box, in base-builds');
    t.same((await call('GET', '/v1/projects/pk/boxes')).body.boxes.map((b: { name: string }) => b.name), ['kv1'], 'not in the project of the token that started it');
    t.equal((await call('GET', '/v1/projects/base-builds/boxes', undefined, pkToken)).status, 404, 'which that token cannot reach');
    const buildId = builds[0].tags['boxhost.build'];
    t.equal((await call('GET', `/v1/base-builds/${buildId}`, undefined, pkToken)).status, 404, 'nor its build record');
    t.equal((await call('GET', `/v1/operations/${first.headers.get('operation-id')}`, undefined, pkToken)).status, 200, 'it follows its own operation');
    const op = (await call('GET', `/v1/operations/${first.headers.get('operation-id')}/wait?timeout=120`)).body;
    t.equal(op.status, 'succeeded', JSON.stringify(op));
    const version = (await call('GET', '/v1/projects/pk/boxes/kv1')).body.base.split('@')[1];
    const build = (await call('GET', '/v1/bases/kv-base')).body;
    t.match(build, { name: 'kv-base', version, origin: 'built' });
    const cached = await call('POST', '/v1/base-builds', { pack: 'kv' });
    t.match(cached.body, { status: 'succeeded', cached: true }, 'the pack form is cached like the triple');

    const made = (await call('GET', '/v1/projects/pk/boxes/kv1')).body;
    const pack = (await call('GET', '/v1/packs/kv')).body;
    instanceRev = pack.revisions.v1.rev;
    t.match(made, { status: 'running', pack: 'kv', pack_rev: instanceRev, lifecycle: 'dev', base: `kv-base@${version}` });
    const second = await call('POST', '/v1/projects/pk/boxes?wait=120', { name: 'kv2', pack: 'kv' });
    t.match(second.body, { status: 'running', pack: 'kv', lifecycle: null, base: `kv-base@${version}` }, 'the next instance takes the built base at once');
    await call('DELETE', '/v1/projects/pk/boxes/kv2?wait=60');

    // A pack whose base build fails: its instance fails with why, and nothing is left.
    const broken = { name: 'broken', default_rev: 'a', revisions: { a: { base: 'broken-base', parent: 'busybox', script: 'exit 7' } } };
    t.equal((await call('POST', '/v1/packs', broken)).status, 201);
    const doomed = await call('POST', '/v1/projects/pk/boxes', { name: 'doomed', pack: 'broken' });
    t.equal(doomed.status, 202);
    const failedOp = (await call('GET', `/v1/operations/${doomed.headers.get('operation-id')}/wait?timeout=120`)).body;
    t.equal(failedOp.status, 'failed');
    const doomedBox = (await call('GET', '/v1/projects/pk/boxes/doomed')).body;
    t.match(doomedBox, { status: 'failed', error: /broken-base@[0-9a-f]{12} was not built/ });
    t.equal((await call('DELETE', '/v1/projects/pk/boxes/doomed?wait=60')).status < 300, true);
    t.equal((await call('DELETE', '/v1/packs/broken')).status, 204);
    const readme = await call('POST', '/v1/projects/pk/boxes/kv1/exec', { command: ['cat', '/srv/kv/README'] });
    t.equal(readme.body.stdout, 'kv-ready\n', "the box has what the pack's script made");
    t.equal(op.kind, 'pack.services', "the create answers with its services' operation, which ends once their gates passed");
    const svcs = (await call('GET', '/v1/projects/pk/boxes/kv1/services')).body.services;
    t.match(svcs, [{ name: 'web', state: 'running', port: 8080 }], "the revision's service runs");
    const served = await call('POST', '/v1/projects/pk/boxes/kv1/exec', { command: ['wget', '-qO-', 'http://127.0.0.1:8080/README'] });
    t.equal(served.body.stdout, 'kv-ready\n', 'and serves');
    t.match(made.publishes, [{ name: 'web', port: 8080 }], 'its publish is made');
    t.equal((await call('GET', '/v1/packs/kv')).body.instances, 1);
    t.equal((await call('DELETE', '/v1/packs/kv')).status, 409, 'no delete while an instance exists');
  });

  t.test('verbs: args appended, declared env only, one event per run with every field', async (t) => {
    // Upper case and punctuation, which no id, token name or timestamp of an event holds (it was
    // 'ada', found once inside a random event id: ev_…ada…).
    const USER = 'Ada.Lovelace-1815';
    const put = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/put', { args: ['color', 'blue'], env: { KV_USER: USER } });
    t.equal(put.status, 200, put.text);
    t.match(put.body, { exit_code: 0, stdout: `stored color by ${USER}\n`, event_id: /^ev_/ });
    const get = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/get', { args: ['/srv/kv/color'] });
    t.equal(get.body.stdout, 'blue\n');
    const failed = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/fail', {});
    t.match(failed.body, { exit_code: 3, stderr: 'no\n' });

    const undeclared = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/put', { args: ['a', 'b'], env: { KV_USER: 'x', SECRET: 'y' } });
    t.equal(undeclared.status, 400);
    t.same(undeclared.body.error.details, [{ field: 'env.SECRET', issue: 'not declared by verb put' }]);
    t.equal((await call('POST', '/v1/projects/pk/boxes/kv1/verbs/nope', {})).status, 404, 'a verb the pack does not have');
    await call('POST', '/v1/projects/pk/boxes?wait=120', { name: 'plain' });
    t.equal((await call('POST', '/v1/projects/pk/boxes/plain/verbs/put', {})).status, 409, 'a box that is not an instance');

    const events = (await call('GET', '/v1/events?box=kv1')).body;
    t.equal(events.events.length, 3, 'one event per run (a refused call is no run)');
    const [last, middle, first] = events.events;
    t.same(Object.keys(first).sort(), ['args', 'box_name', 'duration_ms', 'env_set', 'exit_code', 'id', 'outcome', 'pack', 'project', 'rev', 'ts', 'verb', 'who']);
    t.match(first, { id: put.body.event_id, pack: 'kv', rev: instanceRev, verb: 'put', args: ['color', 'blue'], env_set: ['KV_USER'], box_name: 'kv1', project: 'pk', outcome: 'success', exit_code: 0 });
    t.notOk(JSON.stringify(events).includes(USER), `env values are never kept: ${JSON.stringify(events)}`);
    t.match(first.who, /admin/);
    t.ok(Number.isInteger(first.duration_ms) && first.duration_ms >= 0);
    t.match(middle, { verb: 'get', outcome: 'success', env_set: [] });
    t.match(last, { verb: 'fail', outcome: 'failure', exit_code: 3 });

    // An instance that is stopped: the run cannot happen, the event says so.
    await call('POST', '/v1/projects/pk/boxes/kv1/stop?wait=60');
    const stopped = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/get', { args: ['/srv/kv/color'] });
    t.equal(stopped.status, 409);
    const errEvent = (await call('GET', '/v1/events?box=kv1&outcome=error')).body.events;
    t.equal(errEvent.length, 1);
    t.match(errEvent[0], { verb: 'get', outcome: 'error', error: /stopped/ });
    t.notOk('exit_code' in errEvent[0], 'no exit code when it could not run');
    t.match(stopped.body.error.message, new RegExp(`event ${errEvent[0].id}`));
    await call('POST', '/v1/projects/pk/boxes/kv1/resume?wait=60');
  });

  t.test('events: filters, pages newest first, project limits', async (t) => {
    t.equal((await call('GET', '/v1/events?verb=put')).body.events.length, 1);
    t.equal((await call('GET', '/v1/events?outcome=failure')).body.events.length, 1);
    t.equal((await call('GET', '/v1/events?pack=nope')).body.events.length, 0);
    t.equal((await call('GET', `/v1/events?since=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`)).body.events.length, 0);
    const p1 = (await call('GET', '/v1/events?max_results=2')).body;
    t.equal(p1.events.length, 2);
    t.equal(p1.has_more, true);
    const p2 = (await call('GET', `/v1/events?max_results=2&continuation_token=${p1.next_continuation_token}`)).body;
    t.equal(p2.events.length, 2);
    t.equal(p2.has_more, false);
    t.equal(p2.next_continuation_token, null);
    const all = (await call('GET', '/v1/events')).body.events.map((e: any) => e.id);
    t.same([...p1.events, ...p2.events].map((e: any) => e.id), all, 'the pages are the list, newest first');
    t.equal((await call('GET', '/v1/events?max_results=1001')).status, 400);
    t.equal((await call('GET', '/v1/events?continuation_token=junk')).status, 400);
    t.equal((await call('GET', '/v1/events?outcome=maybe')).status, 400);

    const other = (await call('POST', '/v1/tokens', { name: 'other-only', projects: ['other'] })).body.token;
    t.same((await call('GET', '/v1/events', undefined, other)).body.events, [], "another project's token sees none of them");
    t.equal((await call('GET', '/v1/events?project=pk', undefined, other)).status, 404);
    t.equal((await call('POST', '/v1/packs', manifest, other)).status, 403, 'a project token installs no pack');
    const probe = await call('POST', '/v1/projects/pk/boxes', { name: 'probe', env_from: [{ alias: 'a', box: 'kv1' }] }, other);
    t.equal(probe.status, 404, "another project's boxes are not probed through env_from: the project is not there for this token");
    t.equal((await call('POST', '/v1/projects/pk/boxes', { name: 'probe', pack: 'kv' }, other)).status, 404);
  });

  t.test('the event stream: each new event pushed in order; Last-Event-ID resumes without loss', async (t) => {
    /** Reads SSE frames off a fetch body until `n` events came (or 20 s passed). */
    const open = async (headers: Record<string, string> = {}, query = '') => {
      const ac = new AbortController();
      const res = await fetch(`${host.url}/v1/events/stream${query}`, { headers: { authorization: `Bearer ${host.adminToken}`, ...headers }, signal: ac.signal });
      const reader = res.body!.getReader();
      let buf = '';
      const take = async (n: number) => {
        const got: { id: string; event: string; data: any }[] = [];
        const deadline = Date.now() + 20_000;
        while (got.length < n && Date.now() < deadline) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += Buffer.from(value).toString();
          let at;
          while ((at = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, at);
            buf = buf.slice(at + 2);
            const f: Record<string, string> = {};
            for (const line of frame.split('\n')) {
              const m = /^(id|event|data): ?(.*)$/.exec(line);
              if (m) f[m[1]] = m[2];
            }
            if (f.data !== undefined && f.event) got.push({ id: f.id, event: f.event, data: JSON.parse(f.data) });
          }
        }
        return got;
      };
      return { res, take, close: () => ac.abort() };
    };
    const s1 = await open({}, '?kinds=verb');
    t.equal(s1.res.status, 200);
    t.match(s1.res.headers.get('content-type'), /^text\/event-stream/);
    const a = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/get', { args: ['/srv/kv/color'] });
    const b = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/fail', {});
    const first = await s1.take(2);
    t.same(first.map((e) => [e.event, e.data.id]), [['verb', a.body.event_id], ['verb', b.body.event_id]], 'only new events, in order');
    t.match(first[1].data, { verb: 'fail', outcome: 'failure', exit_code: 3, box_name: 'kv1' });
    s1.close();

    // Dropped: two more runs meanwhile; a reconnect with the last id gets exactly those.
    const c = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/get', { args: ['/srv/kv/color'] });
    const d = await call('POST', '/v1/projects/pk/boxes/kv1/verbs/put', { args: ['x', 'y'] });
    const s2 = await open({ 'last-event-id': first[1].id }, '?box=kv1&kinds=verb');
    const resumed = await s2.take(2);
    t.same(resumed.map((e) => e.data.id), [c.body.event_id, d.body.event_id], 'resumed after the last one seen, nothing lost, nothing twice');
    s2.close();

    // Box lifecycle transitions join the stream as their own kinds (not the verb list).
    const s3 = await open({}, '?box=life&kinds=box');
    await call('POST', '/v1/projects/pk/boxes?wait=60', { name: 'life' });
    await call('POST', '/v1/projects/pk/boxes/life/publish', { port: 8080 });
    await call('POST', '/v1/projects/pk/boxes/life/stop?wait=60');
    await call('DELETE', '/v1/projects/pk/boxes/life?wait=60');
    const life = await s3.take(4);
    s3.close();
    t.same(life.map((e) => e.event), ['box.created', 'box.published', 'box.stopped', 'box.deleted'], 'created, published, stopped, deleted, in order');
    t.match(life[0].data, { kind: 'box.created', project: 'pk', box_name: 'life', outcome: 'success', who: /admin/ });
    t.ok(life.every((e) => Number.isInteger(e.data.duration_ms)), 'each with its duration');
    t.equal((await call('GET', '/v1/events?box=life')).body.events.length, 0, 'the verb list holds verb runs only');
    t.equal((await fetch(`${host.url}/v1/events/stream?kinds=nope`, { headers: { authorization: `Bearer ${host.adminToken}` } })).status, 400, 'an unknown kind');

    // A token holds at most 8 streams on one api process.
    const held = [];
    for (let i = 0; i < 8; i++) held.push(await open({}, '?kinds=verb'));
    t.ok(held.every((h) => h.res.status === 200), '8 streams open');
    const ninth = await fetch(`${host.url}/v1/events/stream`, { headers: { authorization: `Bearer ${host.adminToken}` } });
    t.equal(ninth.status, 429, 'the 9th is refused');
    t.equal(ninth.headers.get('retry-after'), '5');
    t.equal(((await ninth.json()) as any).error.code, 'rate_limited');
    for (const h of held) h.close();
    let again = 0;
    for (let i = 0; i < 50 && again !== 200; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const ac = new AbortController();
      again = (await fetch(`${host.url}/v1/events/stream`, { headers: { authorization: `Bearer ${host.adminToken}` }, signal: ac.signal })).status;
      ac.abort();
    }
    t.equal(again, 200, 'a closed stream gives its place back');

    const bad = await fetch(`${host.url}/v1/events/stream`, { headers: { authorization: `Bearer ${host.adminToken}`, 'last-event-id': 'nope' } });
    t.equal(bad.status, 400, 'a Last-Event-ID the stream never sent');
    const other = (await call('POST', '/v1/tokens', { name: 'other-stream', projects: ['other'] })).body.token;
    const hidden = await fetch(`${host.url}/v1/events/stream?project=pk`, { headers: { authorization: `Bearer ${other}` } });
    t.equal(hidden.status, 404, "another project's stream");
    const unauth = await fetch(`${host.url}/v1/events/stream`);
    t.equal(unauth.status, 401);
  });

  t.test('env_from: the outputs of another instance as ALIAS_KEY variables', async (t) => {
    const kv1 = (await call('GET', '/v1/projects/pk/boxes/kv1')).body;
    const r = await call('POST', '/v1/projects/pk/boxes?wait=120', { name: 'client', env_from: [{ alias: 'store', box: 'kv1' }], environment: { OWN: '1' } });
    t.equal(r.status, 200, r.text);
    t.match(r.body.environment, { STORE_HOST: kv1.address, STORE_NAME: 'kv1.pk', STORE_KEEP: '{{unknown}}', OWN: '1', STORE_PORT: '8080', STORE_PUB: 'web--kv1--pk.localhost', STORE_NOPE: '{{port.nope}}' });
    const pass = r.body.environment.STORE_PASS;
    t.match(pass, /^[A-Za-z0-9_-]{32}$/, 'a secret made for the instance');
    const served = await call('POST', '/v1/projects/pk/boxes/kv1/exec', { command: ['sh', '-c', 'for p in /proc/[0-9]*; do tr "\\0" "\\n" < $p/environ 2>/dev/null | grep "^KV_PASS="; done | sort -u'] });
    t.equal(served.body.stdout, `KV_PASS=${pass}\n`, "the instance's own service got the same secret in its env");
    const again = await call('POST', '/v1/projects/pk/boxes?wait=120', { name: 'client2', env_from: [{ alias: 'store', box: 'kv1' }] });
    t.equal(again.body.environment.STORE_PASS, pass, 'the secret is kept per instance: every consumer gets the same');
    await call('DELETE', '/v1/projects/pk/boxes/client2?wait=60');
    const env = await call('POST', '/v1/projects/pk/boxes/client/exec', { command: ['sh', '-c', 'echo $STORE_HOST $STORE_NAME'] });
    t.equal(env.body.stdout, `${kv1.address} kv1.pk\n`, 'in the box');
    const bad = await call('POST', '/v1/projects/pk/boxes', { name: 'c2', env_from: [{ alias: 'x', box: 'plain' }] });
    t.equal(bad.status, 400);
    t.match(bad.body.error.message, /not a pack instance/);
  });

  t.test('CLI: box pack install/ls/get, box verb, box events', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'pk' };
    const box = (...args: string[]) => new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? ((err as any).code ?? 1) : 0, stdout, stderr }));
    });
    const ls = await box('pack', 'ls');
    t.equal(ls.code, 0, ls.stderr);
    t.match(ls.stdout, /kv\s+[0-9a-f]{12}\s+v1/);
    const built = await box('pack', 'build', 'kv', '--wait');
    t.equal(built.code, 0, built.stderr);
    t.match(built.stdout, /the base of pack kv is built already/);
    const verb = await box('verb', 'kv1', 'put', '--env', 'KV_USER=cli', 'k', 'v');
    t.equal(verb.code, 0, verb.stderr);
    t.equal(verb.stdout, 'stored k by cli\n');
    const failing = await box('verb', 'kv1', 'fail');
    t.equal(failing.code, 3, 'box verb exits with the verb\'s exit code');
    // box events -f: the stream, a line per event as it happens.
    const follower = spawn(process.execPath, [MAIN, 'events', '-f', '--box', 'kv1', '--json'], { env });
    t.teardown(() => void follower.kill());
    let followed = '';
    let followErr = '';
    let exited = false;
    follower.stdout.on('data', (b: Buffer) => (followed += b.toString()));
    follower.stderr.on('data', (b: Buffer) => (followErr += b.toString()));
    follower.once('exit', () => (exited = true));
    // The follower sees only what happens once its stream is open, and a loaded CI machine may
    // take seconds to start it: the verb runs again every 2 s until a line comes (30 times).
    for (let i = 0; i < 600 && !followed.includes('\n') && !exited; i++) {
      if (i % 20 === 0) await call('POST', '/v1/projects/pk/boxes/kv1/verbs/get', { args: ['/srv/kv/color'] });
      await new Promise((r) => setTimeout(r, 100));
    }
    follower.kill();
    if (t.ok(followed.includes('\n'), `box events -f printed a line (${exited ? `it exited: ${followErr}` : 'it ran'})`)) {
      t.match(JSON.parse(followed.split('\n')[0]), { kind: 'verb', verb: 'get', box_name: 'kv1', outcome: 'success' }, 'box events -f prints each event as it comes');
    }

    const events = await box('events', '--verb', 'put', '--json');
    t.equal(JSON.parse(events.stdout).events[0].who !== undefined, true);
    t.equal(JSON.parse(events.stdout).events.length, 3);
    // Page by page, as told: the three, one at a time, newest first.
    const all = JSON.parse(events.stdout).events.map((e: { id: string }) => e.id);
    const first = await box('events', '--verb', 'put', '-n', '1');
    const token = /more events: add --continuation-token (\S+)/.exec(first.stderr)?.[1];
    t.ok(token, `the table says how to ask for more: ${first.stderr}`);
    const second = JSON.parse((await box('events', '--verb', 'put', '-n', '1', '--continuation-token', token ?? '', '--json')).stdout);
    t.same(second.events.map((e: { id: string }) => e.id), [all[1]]);
    t.equal(second.has_more, true);
  });

  t.test('clean-up: the pack goes once its instances have', async (t) => {
    for (const b of ['client', 'kv1', 'plain']) await call('DELETE', `/v1/projects/pk/boxes/${b}?wait=60`);
    t.equal((await call('DELETE', '/v1/packs/kv')).status, 204);
  });
});
