import crypto from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { execFile, spawn } from 'node:child_process';
import t from 'tap';
import type { Test } from 'tap';
import { startTestHost } from './helpers/host';

/**
 * Webhooks on a real host (docs/packs.md "Webhooks"): registration and its refusals (scheme,
 * credentials, addresses webhooks are not sent to, kinds, project limits), signed deliveries of
 * box lifecycle events to a receiver on loopback (allowed by BOXHOST_WEBHOOK_ALLOW_NETS), only a
 * webhook's own project's events, a failing receiver retried until it answers, and an endpoint
 * that never answers blocking nothing.
 */

interface Received {
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A receiver: `/ok` answers 204, `/flaky` 500 twice then 204, `/hang` never answers. */
async function receiver() {
  const got: Received[] = [];
  const hanging: http.ServerResponse[] = [];
  let flaky = 0;
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      got.push({ path: req.url ?? '', headers: req.headers, body });
      if (req.url === '/hang') return void hanging.push(res);
      if (req.url === '/flaky' && ++flaky <= 2) return void res.writeHead(500).end('not yet');
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    got,
    hanging,
    close: async () => {
      for (const r of hanging) r.destroy();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

t.test('webhooks on a real host', async (t) => {
  const host = await startTestHost(t, { BOXHOST_WEBHOOK_ALLOW_NETS: '127.0.0.1/32', BOXHOST_WEBHOOK_RETRY_MS: '100', BOXHOST_EVENT_STREAM_MAX_SECS: '1' });
  const rx = await receiver();
  t.teardown(rx.close);
  const call = (method: string, p: string, body?: unknown, token?: string) => host.call(method, p, { body, ...(token !== undefined ? { token } : {}) });
  const until = async (t: Test, what: string, ok: () => boolean | Promise<boolean>, ms = 30_000) => {
    for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) if (await ok()) return true;
    t.fail(`timed out: ${what}`);
    return false;
  };
  const events = (path: string) => rx.got.filter((g) => g.path === path).map((g) => JSON.parse(g.body));

  let own: { id: string; secret: string };
  let all: { id: string };
  t.test('registration: 201 with the secret once; refusals name the field', async (t) => {
    const r = await call('POST', '/v1/webhooks', { url: `${rx.url}/ok`, project: 'wh', kinds: ['box'] });
    t.equal(r.status, 201, r.text);
    t.match(r.body, { id: /^wh_/, url: `${rx.url}/ok`, project: 'wh', secret: /^whsec_/, last_status: null });
    t.ok(r.body.kinds.includes('box.created') && !r.body.kinds.includes('verb'), 'box: every box kind');
    own = r.body;
    const a = await call('POST', '/v1/webhooks', { url: `${rx.url}/all`, secret: 'a-secret-of-my-own-choosing' });
    t.equal(a.status, 201);
    t.match(a.body, { project: null, kinds: null, secret: 'a-secret-of-my-own-choosing' });
    all = a.body;
    const list = (await call('GET', '/v1/webhooks')).body.webhooks;
    t.same(list.map((w: any) => w.id), [own.id, all.id]);
    t.notOk(list.some((w: any) => 'secret' in w), 'the list never shows secrets');

    for (const [body, field, why] of [
      [{ url: 'ftp://127.0.0.1/x' }, 'url', 'not http(s)'],
      [{ url: 'not a url' }, 'url', 'not a URL'],
      [{ url: 'http://169.254.169.254/latest/meta-data' }, 'url', 'the cloud metadata address'],
      [{ url: 'http://10.1.2.3/' }, 'url', 'a private address'],
      [{ url: 'http://[::1]:9/' }, 'url', 'IPv6 loopback'],
      [{ url: `http://user:pw@127.0.0.1/` }, 'url', 'credentials in the URL'],
      [{ url: `${rx.url}/x`, kinds: ['nope'] }, 'kinds', 'an unknown kind'],
    ] as const) {
      const b = await call('POST', '/v1/webhooks', body);
      t.equal(b.status, 400, `400: ${why}`);
      t.equal(b.body.error?.details?.[0]?.field, field, `names ${field}: ${why}`);
    }
    const projectToken = (await call('POST', '/v1/tokens', { name: 'wh-token', projects: ['wh'] })).body.token;
    const noProject = await call('POST', '/v1/webhooks', { url: `${rx.url}/x` }, projectToken);
    t.equal(noProject.status, 400, 'a project token names its project');
    t.equal((await call('POST', '/v1/webhooks', { url: `${rx.url}/x`, project: 'other' }, projectToken)).status, 404, 'another project: 404');
    const seen = (await call('GET', '/v1/webhooks', undefined, projectToken)).body.webhooks;
    t.same(seen.map((w: any) => w.id), [own.id], "a project token sees its project's webhooks only");
    t.equal((await call('DELETE', `/v1/webhooks/${all.id}`, undefined, projectToken)).status, 404, 'nor removes a host-wide one');
    // At most 20 per project: the 21st is refused, and nothing of it is kept.
    const extra: string[] = [];
    for (let i = 1; i < 20; i++) extra.push((await call('POST', '/v1/webhooks', { url: `${rx.url}/cap${i}`, project: 'cap' })).body.id);
    const over = await call('POST', '/v1/webhooks', { url: `${rx.url}/cap20`, project: 'cap' });
    t.equal(over.status, 201, 'the 20th');
    extra.push(over.body.id);
    const past = await call('POST', '/v1/webhooks', { url: `${rx.url}/cap21`, project: 'cap' });
    t.equal(past.status, 409, 'the 21st of a project');
    t.equal(past.body.error.code, 'conflict');
    t.equal((await call('GET', '/v1/webhooks')).body.webhooks.filter((w: any) => w.project === 'cap').length, 20);
    for (const id of extra) await call('DELETE', `/v1/webhooks/${id}`);
    // Registrations at once cannot pass the cap together: of 26 side by side, exactly 20 are kept.
    const raced = await Promise.all(Array.from({ length: 26 }, (_, i) => call('POST', '/v1/webhooks', { url: `${rx.url}/race${i}`, project: 'race' })));
    t.same([raced.filter((r) => r.status === 201).length, raced.filter((r) => r.status === 409).length], [20, 6], '20 registered, 6 refused');
    const kept = (await call('GET', '/v1/webhooks')).body.webhooks.filter((w: any) => w.project === 'race');
    t.equal(kept.length, 20, 'and 20 are there');
    for (const w of kept) await call('DELETE', `/v1/webhooks/${w.id}`);
  });

  t.test("signed deliveries of the project's box events, and only of its project", async (t) => {
    t.equal((await call('POST', '/v1/projects/wh/boxes?wait=60', { name: 'b1' })).status, 200);
    t.equal((await call('POST', '/v1/projects/zz/boxes?wait=60', { name: 'b2' })).status, 200);
    await until(t, 'the host-wide webhook got both creates', () => events('/all').filter((e) => e.kind === 'box.created').length === 2);
    await until(t, "the project's webhook got its create", () => events('/ok').length >= 1);
    const mine = rx.got.filter((g) => g.path === '/ok');
    t.same(mine.map((g) => JSON.parse(g.body).event.box_name), ['b1'], "never another project's event");
    const d = mine[0];
    t.match(JSON.parse(d.body), { kind: 'box.created', id: /^ev_/, event: { kind: 'box.created', project: 'wh', box_name: 'b1', outcome: 'success' } });
    t.equal(d.headers['boxhost-event-kind'], 'box.created');
    const expected = `v1=${crypto.createHmac('sha256', own.secret).update(`${d.headers['boxhost-timestamp']}.${d.body}`).digest('hex')}`;
    t.equal(d.headers['boxhost-signature'], expected, "signed with the webhook's secret over timestamp.body");
    t.ok(Math.abs(Number(d.headers['boxhost-timestamp']) - Date.now() / 1000) < 60, 'a current timestamp');
    await until(t, 'the delivery is recorded on the webhook', async () => (await call('GET', '/v1/webhooks')).body.webhooks.find((w: any) => w.id === own.id).last_status === 204);
  });

  t.test('a failing receiver is retried with backoff until it answers; a hanging one blocks nothing', async (t) => {
    const flaky = (await call('POST', '/v1/webhooks', { url: `${rx.url}/flaky`, project: 'wh', kinds: ['box.stopped'] })).body;
    const hang = (await call('POST', '/v1/webhooks', { url: `${rx.url}/hang`, project: 'wh' })).body;
    const stop = await call('POST', '/v1/projects/wh/boxes/b1/stop?wait=60');
    t.equal(stop.body.status, 'stopped');
    await until(t, 'three attempts at the flaky receiver', () => rx.got.filter((g) => g.path === '/flaky').length >= 3);
    const tries = rx.got.filter((g) => g.path === '/flaky');
    t.equal(new Set(tries.map((g) => g.headers['boxhost-event-id'])).size, 1, 'the same event each time');
    t.same(tries.map((g) => String(g.headers['boxhost-delivery']).split('/')[1]), ['1', '2', '3'], 'attempts 1, 2, 3');
    await until(t, 'the webhook shows the success', async () => (await call('GET', '/v1/webhooks')).body.webhooks.find((w: any) => w.id === flaky.id).last_status === 204);
    await until(t, 'the hanging receiver holds a delivery', () => rx.hanging.length > 0);
    // With deliveries hanging, the api answers as ever.
    const resumed = await call('POST', '/v1/projects/wh/boxes/b1/resume?wait=60');
    t.equal(resumed.body.status, 'running', 'the api is not held by a receiver that never answers');
    t.equal((await call('DELETE', `/v1/webhooks/${hang.id}`)).status, 204);
    t.equal((await call('DELETE', `/v1/webhooks/${hang.id}`)).status, 404);
  });

  t.test("a revoked token's webhooks get nothing more", async (t) => {
    const tok = (await call('POST', '/v1/tokens', { name: 'wh-short', projects: ['wh'] })).body;
    const hook = (await call('POST', '/v1/webhooks', { url: `${rx.url}/revoked`, project: 'wh', kinds: ['box.deleted'] }, tok.token)).body;
    t.match(hook, { id: /^wh_/ });
    t.equal((await call('DELETE', `/v1/tokens/${tok.id}`)).status, 204);
    const allBefore = events('/all').length;
    t.equal((await call('POST', '/v1/projects/wh/boxes?wait=60', { name: 'b4' })).status, 200);
    t.ok((await call('DELETE', '/v1/projects/wh/boxes/b4?wait=60')).status < 300);
    await until(t, 'the host-wide webhook got the delete', () => events('/all').slice(allBefore).some((e) => e.kind === 'box.deleted' && e.event.box_name === 'b4'));
    await sleep(500);
    t.same(events('/revoked'), [], 'nothing went to the revoked token\'s webhook');
    await call('DELETE', `/v1/webhooks/${hook.id}`);
  });

  t.test('CLI: box webhook add, ls, rm', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken };
    const box = (...args: string[]) => new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? ((err as any).code ?? 1) : 0, stdout, stderr }));
    });
    const add = await box('webhook', 'add', `${rx.url}/cli`, '--project', 'wh', '--kind', 'verb,box.deleted');
    t.equal(add.code, 0, add.stderr);
    t.match(add.stdout, /registered webhook wh_\S+ for project wh \(kinds: verb,box.deleted\)[\s\S]*whsec_/);
    const ls = await box('webhook', 'ls', '--json');
    const cli = JSON.parse(ls.stdout).webhooks.find((w: any) => w.url === `${rx.url}/cli`);
    t.match(cli, { project: 'wh', kinds: ['verb', 'box.deleted'] });
    const bad = await box('webhook', 'add', 'http://10.0.0.1/');
    t.not(bad.code, 0, 'a refused URL fails the command');
    t.match(bad.stderr, /private/);
    const rm = await box('webhook', 'rm', cli.id);
    t.equal(rm.code, 0, rm.stderr);
  });

  t.test('box events -f reconnects when its stream ends (here after 1 s) and misses nothing', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken };
    const follower = spawn(process.execPath, [MAIN, 'events', '-f', '--project', 'wh', '--json'], { env });
    let out = '';
    let err = '';
    follower.stdout.on('data', (b: Buffer) => (out += b.toString()));
    follower.stderr.on('data', (b: Buffer) => (err += b.toString()));
    t.teardown(() => void follower.kill());
    await sleep(2500); // its first stream has ended by now
    t.equal((await call('POST', '/v1/projects/wh/boxes?wait=60', { name: 'b3' })).status, 200);
    await sleep(1200);
    t.equal((await call('POST', '/v1/projects/wh/boxes/b3/stop?wait=60')).status, 200);
    if (!(await until(t, 'both events printed', () => out.includes('"box.stopped"')))) t.comment(`stdout: ${out}\nstderr: ${err}`);
    const kinds = out.trim().split('\n').map((l) => JSON.parse(l)).filter((e) => e.box_name === 'b3').map((e) => e.kind);
    t.same(kinds, ['box.created', 'box.stopped'], 'each once, in order, across reconnects');
    t.equal(follower.exitCode, null, 'still following');
    await call('DELETE', '/v1/projects/wh/boxes/b3?wait=60');
  });

  t.test('clean-up', async (t) => {
    for (const [p, b] of [['wh', 'b1'], ['zz', 'b2']]) await call('DELETE', `/v1/projects/${p}/boxes/${b}?wait=60`);
    for (const w of (await call('GET', '/v1/webhooks')).body.webhooks) t.equal((await call('DELETE', `/v1/webhooks/${w.id}`)).status, 204);
  });
});
