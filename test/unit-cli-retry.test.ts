import './helpers/childEnv';
import http from 'node:http';
import { AddressInfo } from 'node:net';
import t, { Test } from 'tap';
import { ApiError, Client, retryAfterSecs, RetryPolicy } from '../cli/client';
import { runBox } from './helpers/cli';

/**
 * The CLI sends a call the api refused for now again (cli/client.ts `retryAfterSecs`): a 429
 * with a short Retry-After, any method; a 503 of a GET. Against a real HTTP server on loopback
 * that answers from a script, so each refusal is given exactly; the api's own 429s and 503s
 * (their codes, bodies and Retry-After) are tested on real hosts (exec-limits, admission, cli).
 */
type Answer = { status: number; retryAfter?: string; body?: unknown };

async function stubServer(t: Test, script: Answer[]) {
  const seen: string[] = [];
  const server = http.createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const a = script[Math.min(seen.length - 1, script.length - 1)];
    const body = a.body ?? (a.status < 300 ? { ok: true } : { error: { code: a.status === 429 ? 'rate_limited' : 'unavailable', message: `refused ${seen.length}`, details: [] } });
    res.writeHead(a.status, { 'content-type': 'application/json', ...(a.retryAfter ? { 'retry-after': a.retryAfter } : {}) });
    res.end(JSON.stringify(body));
  });
  // A WebSocket handshake (exec, console) is answered alike, as a plain HTTP answer.
  server.on('upgrade', (req, socket) => {
    seen.push(`UPGRADE ${req.url?.split('?')[0]}`);
    const a = script[Math.min(seen.length - 1, script.length - 1)];
    const body = JSON.stringify({ error: { code: a.status === 429 ? 'rate_limited' : 'unavailable', message: `refused ${seen.length}`, details: [] } });
    socket.end(`HTTP/1.1 ${a.status} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${a.retryAfter ? `retry-after: ${a.retryAfter}\r\n` : ''}connection: close\r\n\r\n${body}`);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

/** A client whose waits are recorded, not slept. */
function client(url: string, retries = 3) {
  const said: string[] = [];
  const waited: number[] = [];
  const policy: RetryPolicy = { retries, say: (l) => said.push(l), sleep: async (ms) => void waited.push(ms) };
  return { c: new Client({ url, token: 'tok', source: 'test' }, policy), said, waited };
}

t.test('which refusals are sent again, and after how long', async (t) => {
  t.equal(retryAfterSecs('POST', 429, '1', 0), 1, 'a 429 of a concurrency cap (1 s), even a POST: it did nothing');
  t.equal(retryAfterSecs('GET', 429, '5', 0), 5);
  t.equal(retryAfterSecs('POST', 429, '60', 0), null, "a project quota's 429 (60 s) is reported at once");
  t.equal(retryAfterSecs('POST', 429, undefined, 0), null, 'a 429 without Retry-After is not');
  t.equal(retryAfterSecs('POST', 429, 'Wed, 21 Oct 2026 07:28:00 GMT', 0), null, 'nor one with a date');
  t.equal(retryAfterSecs('GET', 503, undefined, 0), 1, 'a 503 of a GET: 1, 2, 4 s');
  t.equal(retryAfterSecs('GET', 503, undefined, 2), 4);
  t.equal(retryAfterSecs('GET', 503, '5', 0), 5, 'or its Retry-After');
  t.equal(retryAfterSecs('GET', 503, '60', 0), null, 'not one that asks to wait long: reported');
  t.equal(retryAfterSecs('GET', 503, undefined, 9), 10, 'the backoff stops growing at 10 s');
  t.equal(retryAfterSecs('POST', 503, '1', 0), null, 'never a 503 of a POST: it may have done part of its work');
  t.equal(retryAfterSecs('DELETE', 503, undefined, 0), null);
  for (const status of [400, 401, 404, 409, 500, 507]) t.equal(retryAfterSecs('GET', status, '1', 0), null, `never a ${status}`);
});

t.test('a 503 of a GET is sent again until it is answered', async (t) => {
  const s = await stubServer(t, [{ status: 503 }, { status: 503, retryAfter: '3' }, { status: 200, body: { name: 'web' } }]);
  const { c, said, waited } = client(s.url);
  const r = await c.get('/v1/projects/p/boxes/web');
  t.same(r.body, { name: 'web' });
  t.equal(s.seen.length, 3, 'three requests');
  t.same(waited, [1000, 3000], 'after 1 s, then after its Retry-After');
  t.match(said[0], /^box: refused 1 \(HTTP 503\); trying again in 1 s \(1 of 3\)$/, 'each retry is said');
  t.equal(said.length, 2);
});

t.test('a 429 of a POST is sent again with the same body; a 503 of a POST is not', async (t) => {
  const s = await stubServer(t, [{ status: 429, retryAfter: '1' }, { status: 200, body: { exit_code: 0 } }]);
  const { c, waited } = client(s.url);
  t.same((await c.post('/v1/projects/p/boxes/web/exec', { command: ['true'] })).body, { exit_code: 0 });
  t.same(s.seen, ['POST /v1/projects/p/boxes/web/exec', 'POST /v1/projects/p/boxes/web/exec']);
  t.same(waited, [1000]);

  const s2 = await stubServer(t, [{ status: 503, retryAfter: '1' }, { status: 200 }]);
  const c2 = client(s2.url);
  const err = await c2.c.post('/v1/projects/p/boxes', { name: 'x' }).catch((e) => e);
  t.ok(err instanceof ApiError && err.status === 503, 'thrown as it came');
  t.equal(s2.seen.length, 1, 'sent once');
  t.same(c2.said, []);
});

t.test('a quota refusal, a 503 the call accepts and BOXHOST_RETRIES=0 are answered at once', async (t) => {
  const quota = await stubServer(t, [{ status: 429, retryAfter: '60' }, { status: 200 }]);
  const a = client(quota.url);
  t.equal((await a.c.post('/v1/projects/p/boxes', { name: 'x' }).catch((e) => e)).status, 429);
  t.equal(quota.seen.length, 1);

  const health = await stubServer(t, [{ status: 503, body: { status: 'degraded' } }, { status: 200 }]);
  const b = client(health.url);
  t.same((await b.c.get('/healthz', { accept: [503] })).body, { status: 'degraded' }, '/healthz 503 is an answer');
  t.equal(health.seen.length, 1);

  const never = await stubServer(t, [{ status: 503 }, { status: 200 }]);
  const c = client(never.url, 0);
  t.equal((await c.c.get('/v1/nodes').catch((e) => e)).status, 503);
  t.equal(never.seen.length, 1);
});

t.test('it gives up after its retries, with the last refusal', async (t) => {
  const s = await stubServer(t, [{ status: 503 }]);
  const { c, waited } = client(s.url, 2);
  const err = await c.get('/v1/nodes').catch((e) => e);
  t.ok(err instanceof ApiError && err.status === 503 && /refused 3/.test(err.message), String(err?.message));
  t.equal(s.seen.length, 3, 'the first try and 2 more');
  t.same(waited, [1000, 2000]);
});

const box = runBox;

t.test('the box CLI retries, says so on stderr, and takes BOXHOST_RETRIES', async (t) => {
  for (const [how, args, call] of [
    ['exec --json (POST …/exec)', ['exec', 'web', '-p', 'p', '--json', '--', 'true'], 'POST /v1/projects/p/boxes/web/exec'],
    ['exec (its WebSocket handshake)', ['exec', 'web', '-p', 'p', '--', 'true'], 'UPGRADE /v1/projects/p/boxes/web/exec/ws'],
  ] as const) {
    const s = await stubServer(t, [{ status: 429, retryAfter: '1' }]);
    const run = await box([...args], { BOXHOST_URL: s.url, BOXHOST_TOKEN: 'tok', BOXHOST_RETRIES: '1' });
    t.equal(run.code, 1, `${how}: exit 1 once it gives up`);
    t.match(run.stderr, /^box: refused 1 \(HTTP 429\); trying again in 1 s \(1 of 1\)$/m, `${how}: the retry is said`);
    t.match(run.stderr, /^error: refused 2$/m, `${how}: then the last refusal`);
    t.same(s.seen, [call, call], `${how}: BOXHOST_RETRIES=1, one more try`);
  }
  // Sent once: a 503 of exec's handshake (the api starts the process before it upgrades), a
  // verb (a refused run is recorded as an event).
  for (const [how, args, status] of [
    ['a 503 of exec (its WebSocket handshake)', ['exec', 'web', '-p', 'p', '--', 'true'], 503],
    ['a 429 of a verb', ['verb', 'kv1', 'put', '-p', 'p', 'k', 'v'], 429],
  ] as const) {
    const s = await stubServer(t, [{ status, retryAfter: '1' }]);
    const run = await box([...args], { BOXHOST_URL: s.url, BOXHOST_TOKEN: 'tok' });
    t.equal(run.code, 1, `${how}: exit 1`);
    t.equal(s.seen.length, 1, `${how}: sent once`);
    t.notMatch(run.stderr, /trying again/, `${how}: no retry said`);
  }
});
