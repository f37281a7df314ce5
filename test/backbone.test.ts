import t, { type Test } from 'tap';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import zlib from 'node:zlib';
import Joi from 'joi';
import express from 'express';
import expressWs from 'express-ws';
import IORedis from 'ioredis';
import { sha256 } from '../core/ids';
import { routes } from '../api/routes';
import { expressPath } from '../api/http/route';
import { guardUpgrades, websocketRoutes } from '../api/http/upgrade';
import { request, startTestHost, testConfig, TestHost } from './helpers/host';
import { startHost } from '../server/host';
import { run, sleep } from '../core/command';
import { redisOptions } from '../core/redis';
import { defineJob, jobType } from '../jobs/types';
import { publicReason } from '../jobs/publicReason';

/** One request with exactly these bytes and headers (fetch would fix up some of them). */
function rawRequest(url: string, method: string, p: string, opts: { headers?: Record<string, string>; body?: Buffer | string } = {}) {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string; body: any }>((resolve, reject) => {
    const body = opts.body === undefined ? undefined : Buffer.from(opts.body);
    const req = http.request(`${url}${p}`, { method, headers: { ...(body ? { 'content-length': String(body.length) } : {}), ...opts.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: any;
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = undefined;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body: parsed });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** A WebSocket handshake: the answer when it is refused, or `upgraded` when it is accepted. */
function handshake(url: string, p: string, token?: string) {
  return new Promise<{ upgraded: boolean; status: number; headers: http.IncomingHttpHeaders; body: any }>((resolve, reject) => {
    const req = http.request(`${url}${p}`, {
      headers: {
        connection: 'Upgrade',
        upgrade: 'websocket',
        'sec-websocket-version': '13',
        'sec-websocket-key': Buffer.from('0123456789abcdef').toString('base64'),
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
    });
    req.on('upgrade', (res, socket) => {
      socket.destroy();
      resolve({ upgraded: true, status: res.statusCode ?? 0, headers: res.headers, body: undefined });
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () => {
        let body: any;
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch {
          body = undefined;
        }
        resolve({ upgraded: false, status: res.statusCode ?? 0, headers: res.headers, body });
      });
    });
    req.on('error', reject);
    req.end();
  });
}

/** A host command that fails, saying a path and a secret-looking file as a real tool would. */
const leakyJob = defineJob<{ tag: string }>({
  type: jobType('test.leaky', Joi.object({ tag: Joi.string().required() })),
  attempts: 2,
  async run() {
    await run(['/bin/sh', '-c', 'echo "open /etc/boxhost/cluster-secret: permission denied" >&2; exit 3']);
  },
});

/** No host path, command line or tool output: what a project token may read. */
const PUBLIC_TEXT = /^[^/]*$/;
const TOOL_WORDS = /\b(runc|zfs|zpool|sh|echo|iptables|mkdir|bundle)\b|cluster-secret|exited \d+:/;

t.test('backbone over real HTTP (sqlite file, embedded Redis)', async (t) => {
  const host = await startTestHost(t, {}, { extraJobs: [leakyJob] });

  t.test('version and healthz need no token', async (t) => {
    const v = await host.call('GET', '/version', { token: null });
    t.equal(v.status, 200);
    t.equal(v.body.api_version, 'v1');
    t.match(v.body.version, /^\d+\.\d+\.\d+/);
    t.type(v.body.commit, 'string');
    const h = await host.call('GET', '/healthz', { token: null });
    t.equal(h.status, 200, JSON.stringify(h.body));
    t.same(h.body.checks, { db: 'ok', redis: 'ok', storage: 'ok', workers: 1, nodes: { local: 'ok' } });
    t.equal(h.body.status, 'ok');
  });

  t.test('every /v1 route needs a valid bearer token', async (t) => {
    for (const token of [null, 'bxh_not-a-real-token']) {
      const r = await host.call('GET', '/v1/tokens', { token });
      t.equal(r.status, 401);
      t.equal(r.body.error.code, 'unauthenticated');
      t.same(r.body.error.details, []);
      t.equal(r.headers.get('www-authenticate'), 'Bearer realm="boxhost"', 'the 401 says how to authenticate');
    }
    const malformed = await host.call('GET', '/v1/tokens', { token: null, headers: { authorization: 'Basic abc' } });
    t.equal(malformed.status, 401);
    t.equal((await host.call('GET', '/v1/projects/-/boxes?tag=%zz', { token: null })).status, 401, 'without a token, 401 before the broken query');
    t.equal((await host.call('GET', '/v1/projects/-/boxes?tag=%zz')).status, 400, 'with one, the broken query');
  });

  t.test('tokens: secret once, hashed at rest, expiry, project limit, revoke', async (t) => {
    const created = await host.call('POST', '/v1/tokens', { body: { name: 'ci-bot', projects: ['alpha'] } });
    t.equal(created.status, 201);
    const secret = created.body.token as string;
    t.match(secret, /^bxh_/);
    t.same(created.body.projects, ['alpha']);
    t.equal(created.body.expires_at, null);

    const rows = await host.db('tokens').select();
    const row = rows.find((r: any) => r.id === created.body.id);
    t.equal(row.secret_hash, sha256(secret), 'stored as its sha256');
    t.notOk(JSON.stringify(rows).includes(secret), 'the secret itself is nowhere in the table');

    const list = await host.call('GET', '/v1/tokens');
    t.equal(list.status, 200);
    const listed = list.body.tokens.find((x: any) => x.id === created.body.id);
    t.ok(listed);
    t.equal(listed.token, undefined, 'list never shows secrets');

    // A project-limited token works on /v1 but not on admin routes.
    const ops = await host.call('GET', '/v1/operations/op_doesnotexist', { token: secret });
    t.equal(ops.status, 404, 'authenticated');
    const forbidden = await host.call('GET', '/v1/tokens', { token: secret });
    t.equal(forbidden.status, 403);
    t.equal(forbidden.body.error.code, 'permission_denied');
    const used = await host.call('GET', '/v1/tokens');
    t.ok(used.body.tokens.find((x: any) => x.id === created.body.id).last_used_at, 'last_used_at recorded');

    const short = await host.call('POST', '/v1/tokens', { body: { name: 'short', expires_in: 1 } });
    t.equal(short.status, 201);
    t.ok(Date.parse(short.body.expires_at) - Date.parse(short.body.created_at) === 1000);
    t.equal((await host.call('GET', '/v1/tokens', { token: short.body.token })).status, 200);
    await new Promise((r) => setTimeout(r, 1100));
    t.equal((await host.call('GET', '/v1/tokens', { token: short.body.token })).status, 401, 'expired');

    const del = await host.call('DELETE', `/v1/tokens/${created.body.id}`);
    t.equal(del.status, 204);
    t.equal(del.text, '');
    t.equal((await host.call('GET', '/v1/operations/op_x', { token: secret })).status, 401, 'revoked');
    t.equal((await host.call('DELETE', `/v1/tokens/${created.body.id}`)).status, 404);
    t.equal((await host.call('DELETE', '/v1/tokens/tok_admin')).status, 409);

    const bad = await host.call('POST', '/v1/tokens', { body: { name: 'Bad Name', projects: [], expires_in: -5 } });
    t.equal(bad.status, 400);
    t.same(bad.body.error.details.map((d: any) => d.field).sort(), ['expires_in', 'name', 'projects']);
  });

  t.test('error contract', async (t) => {
    const badJson = await host.call('POST', '/v1/tokens', { raw: '{"name": ' });
    t.equal(badJson.status, 400);
    t.equal(badJson.body.error.code, 'invalid_argument');
    // A JSON body is read as JSON whatever its Content-Type says (curl -d sends the form type):
    // what the client meant, or a 400 saying it is not JSON; never ignored as "name is required".
    for (const type of ['application/x-www-form-urlencoded', 'text/plain']) {
      const r = await host.call('POST', '/v1/tokens', { raw: JSON.stringify({ name: `typed-${type.split('/')[1].slice(0, 5)}` }), contentType: type });
      t.equal(r.status, 201, `a JSON body sent as ${type} is read: ${r.text.slice(0, 120)}`);
      t.equal((await host.call('DELETE', `/v1/tokens/${r.body.id}`)).status, 204);
    }
    const form = await host.call('POST', '/v1/tokens', { raw: 'name=x', contentType: 'application/x-www-form-urlencoded' });
    t.equal(form.status, 400);
    t.same(form.body.error.details, [{ field: 'body', issue: 'not valid JSON' }], 'a form body is said to be no JSON');

    const unknown = await host.call('GET', '/v1/nothing-here');
    t.equal(unknown.status, 404);
    t.equal(unknown.body.error.code, 'not_found');
    t.equal((await host.call('PATCH', '/v1/projects/alpha/nothing-here')).status, 404, 'an unknown path under any method is 404');

    // A route's path under a method it does not take: 405 naming the methods it does (Allow).
    for (const [method, p, allow] of [
      ['PATCH', '/v1/projects/alpha/boxes', 'GET, HEAD, POST'],
      ['DELETE', '/v1/projects/alpha/boxes/', 'GET, HEAD, POST'],
      ['POST', '/v1/projects/alpha/boxes/web', 'DELETE, GET, HEAD, PUT'],
      ['PUT', '/V1/TOKENS', 'GET, HEAD, POST'],
      ['POST', '/healthz', 'GET, HEAD'],
      ['POST', '/v1/projects/alpha/boxes/web/exec/ws', 'GET, HEAD'],
    ] as const) {
      for (const token of [undefined, null]) {
        const r = await host.call(method, p, token === null ? { token: null } : {});
        t.equal(r.status, 405, `${method} ${p} → 405${token === null ? ' (no token)' : ''}`);
        t.equal(r.headers.get('allow'), allow, `${method} ${p}: Allow ${allow}`);
        t.equal(r.body.error.code, 'invalid_argument');
        t.same(r.body.error.details, [{ field: 'method', issue: `must be one of ${allow}` }]);
      }
    }
    // A WebSocket route asked with plain HTTP: 426, with the upgrade it needs (HEAD too).
    const plain = await host.call('GET', '/v1/projects/alpha/boxes/web/exec/ws?command=true');
    t.equal(plain.status, 426);
    t.equal((await host.call('HEAD', '/v1/projects/alpha/boxes/web/console')).status, 426);
    t.equal(plain.headers.get('upgrade'), 'websocket');
    t.equal(plain.body.error.code, 'invalid_argument');
    // OPTIONS is answered with the methods (express's own answer).
    const options = await rawRequest(host.url, 'OPTIONS', '/v1/projects/alpha/boxes');
    t.equal(options.status, 200);
    t.equal(options.headers.allow, 'GET, HEAD, POST');

    const big = await host.call('POST', '/v1/repohost/grants', {
      raw: JSON.stringify({ name: 'big', permissions: {}, repositories: [], pad: 'x'.repeat(1024 * 1024 + 10) }),
    });
    t.equal(big.status, 413);
    t.equal(big.body.error.code, 'payload_too_large');
    // A caller without a valid token hears 401 before anything about its body (nothing is parsed).
    for (const raw of ['{"name": "big", "pad": "' + 'x'.repeat(1024 * 1024 + 10) + '"}', '{not json', '{"name": 1}']) {
      const anon = await host.call('POST', '/v1/repohost/grants', { raw, token: null });
      t.equal(anon.status, 401, `no token, body ${raw.slice(0, 12)}…: 401`);
      t.equal(anon.body.error.code, 'unauthenticated');
    }

    const unknownField = await host.call('POST', '/v1/repohost/grants', { body: { name: 'g', permissions: {}, repositories: [], extra: 1 } });
    t.equal(unknownField.status, 400);
    t.same(unknownField.body.error.details, [{ field: 'extra', issue: 'is not allowed' }]);

    // An unexpected failure: the table behind a route disappears under the running host.
    await host.db.schema.renameTable('grants', 'grants_hidden');
    t.teardown(() => host.db.schema.renameTable('grants_hidden', 'grants'));
    const boom = await host.call('GET', '/v1/repohost/grants');
    t.equal(boom.status, 500);
    t.equal(boom.body.error.code, 'internal');
    t.notMatch(boom.text, /at .*\.js:\d+/, 'no stack trace in the body');
    t.notMatch(boom.text, /grants/, 'no internals in the body');
    const requestId = boom.headers.get('x-request-id')!;
    t.ok(requestId);
    t.match(boom.body.error.message, requestId);
    t.ok(host.logs.some((l) => l.req?.id === requestId || l.reqId === requestId || JSON.stringify(l).includes(requestId)), 'request id is in the logs');
  });

  t.test('auth settings: defaults, partial update', async (t) => {
    const get = await host.call('GET', '/v1/auth/settings');
    t.equal(get.status, 200);
    t.same(get.body.settings, { allow_all_idp_accounts: false, allowed_domains: [], allowed_emails: [], protect_system_domains: false });
    t.equal(get.body.configured, false);
    for (const k of ['auth_redirect_uri', 'auth_url', 'idp_auth_client_url']) t.type(get.body[k], 'string');

    const put = await host.call('PUT', '/v1/auth/settings', { body: { allowed_domains: ['example.com'], allow_all_idp_accounts: null } });
    t.equal(put.status, 200);
    t.same(put.body.settings, { allow_all_idp_accounts: false, allowed_domains: ['example.com'], allowed_emails: [], protect_system_domains: false });
    const put2 = await host.call('PUT', '/v1/auth/settings', { body: { protect_system_domains: true } });
    t.same(put2.body.settings.allowed_domains, ['example.com'], 'absent field unchanged');
    t.equal(put2.body.settings.protect_system_domains, true);
    t.same((await host.call('GET', '/v1/auth/settings')).body.settings, put2.body.settings);
    t.equal((await host.call('PUT', '/v1/auth/settings', { body: { allowed_emails: ['not-an-email'] } })).status, 400);
    // The one body normalised rather than refused: domains and emails are kept lowercased.
    const mixed = await host.call('PUT', '/v1/auth/settings', { body: { allowed_domains: ['Example.COM'], allowed_emails: ['Ann@Example.COM'] } });
    t.equal(mixed.status, 200, mixed.text);
    t.same([mixed.body.settings.allowed_domains, mixed.body.settings.allowed_emails], [['example.com'], ['ann@example.com']]);
    t.equal((await host.call('PUT', '/v1/auth/settings', { body: { allowed_domains: ['a.com', 'A.com'] } })).status, 400, 'duplicates once lowercased');
    t.equal((await host.call('PUT', '/v1/auth/settings', { body: { protect_system_domains: 'true' } })).status, 400, 'a string is no boolean');
  });

  t.test('repository-host grants', async (t) => {
    const body = { name: 'deploy-keys', permissions: { contents: 'read', pull_requests: 'write' }, repositories: ['acme/web', 'acme/api'] };
    const c = await host.call('POST', '/v1/repohost/grants', { body });
    t.equal(c.status, 201);
    t.match(c.body, body);
    t.equal((await host.call('POST', '/v1/repohost/grants', { body })).status, 409);
    t.equal((await host.call('GET', '/v1/repohost/grants/deploy-keys')).body.name, 'deploy-keys');
    t.equal((await host.call('GET', '/v1/repohost/grants')).body.grants.length, 1);
    const u = await host.call('PUT', '/v1/repohost/grants/deploy-keys', { body: { repositories: ['acme/docs'] } });
    t.equal(u.status, 200);
    t.same(u.body.repositories, ['acme/docs']);
    t.same(u.body.permissions, body.permissions);
    for (const bad of [
      { ...body, name: 'x--y' },
      { ...body, permissions: { contents: 'admin' } },
      { ...body, repositories: ['no-slash'] },
      { ...body, permissions: { contents: 1 } },
    ]) {
      const r = await host.call('POST', '/v1/repohost/grants', { body: bad });
      t.equal(r.status, 400, JSON.stringify(bad));
    }
    // One detail per wrong permission, whatever its type.
    for (const value of [1, 'admin']) {
      const r = await host.call('POST', '/v1/repohost/grants', { body: { ...body, name: 'one-detail', permissions: { contents: value } } });
      t.same(r.body.error.details, [{ field: 'permissions.contents', issue: 'must be "read" or "write"' }], `permission ${JSON.stringify(value)}`);
    }
    t.equal((await host.call('DELETE', '/v1/repohost/grants/deploy-keys')).status, 204);
    t.equal((await host.call('GET', '/v1/repohost/grants/deploy-keys')).status, 404);
  });

  t.test('bad input a new user tries gets the contract 4xx, never a 500', async (t) => {
    const auth = { authorization: `Bearer ${host.adminToken}` };
    const expectError = (t: Test, r: { status: number; body: any; text: string }, status: number, code: string, what: string) => {
      t.equal(r.status, status, `${what} → ${status}: ${r.text}`);
      t.equal(r.body?.error?.code, code, `${what}: code ${code}`);
      t.type(r.body?.error?.message, 'string');
      t.ok(Array.isArray(r.body?.error?.details), `${what}: details is an array`);
    };
    // No refused request may leave an operation or a box behind (checked at the end).
    const rows = async () => ({ ops: Number((await host.db('operations').count({ n: '*' }))[0].n), boxes: Number((await host.db('boxes').count({ n: '*' }))[0].n) });
    const rowsBefore = await rows();

    // Malformed percent-encoding in the path.
    for (const p of ['/v1/projects/%E0%A4%A/boxes', '/v1/projects/p/boxes/%', '/v1/projects/%ZZ/boxes/web']) {
      const r = await rawRequest(host.url, 'GET', p, { headers: auth });
      expectError(t, r, 400, 'invalid_argument', `GET ${p}`);
      t.same(r.body.error.details, [{ field: 'path', issue: 'is not valid percent-encoded UTF-8' }]);
    }
    t.equal((await rawRequest(host.url, 'GET', '/v1/projects/p%2Dq/boxes', { headers: auth })).status, 200, 'valid percent-encoding still works');

    const grant = (name: string) => JSON.stringify({ name, permissions: { contents: 'read' }, repositories: ['acme/web'] });
    const post = (body: Buffer | string, headers: Record<string, string>) => rawRequest(host.url, 'POST', '/v1/repohost/grants', { headers: { ...auth, ...headers }, body });

    // A charset other than UTF-8: 415 (docs/decisions.md "Requests and errors").
    for (const charset of ['latin-9', 'iso-8859-1', 'utf-16']) {
      const r = await post(grant('cs'), { 'content-type': `application/json; charset=${charset}` });
      expectError(t, r, 415, 'invalid_argument', `charset=${charset}`);
      t.same(r.body.error.details, [{ field: 'content-type', issue: 'charset must be utf-8' }]);
    }
    // An unknown coding is 415; a body that is not what its coding says is 400.
    expectError(t, await post(grant('ce'), { 'content-type': 'application/json', 'content-encoding': 'br-foo' }), 415, 'invalid_argument', 'Content-Encoding br-foo');
    expectError(t, await post(grant('ce'), { 'content-type': 'application/json', 'content-encoding': 'gzip' }), 400, 'invalid_argument', 'gzip that is not gzip');
    const cut = zlib.gzipSync(grant('ce')).subarray(0, 20);
    expectError(t, await post(cut, { 'content-type': 'application/json', 'content-encoding': 'gzip' }), 400, 'invalid_argument', 'truncated gzip');
    expectError(t, await post(Buffer.from('not deflate'), { 'content-type': 'application/json', 'content-encoding': 'deflate' }), 400, 'invalid_argument', 'deflate that is not deflate');
    t.equal((await rawRequest(host.url, 'GET', '/v1/repohost/grants/ce', { headers: auth })).status, 404, 'nothing was stored');
    // Positive controls: a real gzip body and an explicit utf-8 charset are taken.
    t.equal((await post(zlib.gzipSync(grant('gz-ok')), { 'content-type': 'application/json', 'content-encoding': 'gzip' })).status, 201, 'gzip body accepted');
    t.equal((await post(grant('cs-ok'), { 'content-type': 'application/json; charset=UTF-8' })).status, 201, 'charset=UTF-8 accepted');

    // Invalid UTF-8 inside a JSON string: 400, not U+FFFD in the db.
    const badUtf8 = Buffer.concat([Buffer.from('{"name": "ok-'), Buffer.from([0xff, 0xfe]), Buffer.from('", "permissions": {}, "repositories": []}')]);
    const r8 = await post(badUtf8, { 'content-type': 'application/json' });
    expectError(t, r8, 400, 'invalid_argument', 'invalid UTF-8');
    t.same(r8.body.error.details, [{ field: 'body', issue: 'is not valid UTF-8' }]);
    const overlong = Buffer.concat([Buffer.from('{"name": "x", "permissions": {"a": "'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}, "repositories": []}')]);
    expectError(t, await post(overlong, { 'content-type': 'application/json' }), 400, 'invalid_argument', 'overlong UTF-8');
    expectError(t, await post('{"name": "x", "permissions": {}, "repositories": ["\\ud800"]}', { 'content-type': 'application/json' }), 400, 'invalid_argument', 'lone surrogate');
    // Valid multi-byte UTF-8 passes the check and is judged by the schema (the name, not the body).
    const utf8ok = await post(grant('grüße'), { 'content-type': 'application/json' });
    t.equal(utf8ok.status, 400);
    t.same(utf8ok.body.error.details.map((d: any) => d.field), ['name'], 'valid UTF-8 reaches validation');
    t.notOk((await host.db('grants').select('name')).some((g: any) => g.name.includes('\ufffd')), 'no replacement character stored');

    // Operation ids: the wrong shape is as unknown as an unknown id.
    for (const id of ['op_unknown1', 'not-an-op', 'op_UPPER', 'op_', `op_${'a'.repeat(300)}`, '%20']) {
      for (const suffix of ['', '/wait?timeout=0']) {
        const r = await host.call('GET', `/v1/operations/${id}${suffix}`);
        expectError(t, r, 404, 'not_found', `operation ${id}${suffix}`);
      }
    }

    // A PUT of the whole grant record, its own name included.
    const whole = (await host.call('GET', '/v1/repohost/grants/gz-ok')).body;
    const put = await host.call('PUT', '/v1/repohost/grants/gz-ok', { body: { name: 'gz-ok', permissions: { contents: 'write' }, repositories: whole.repositories } });
    t.equal(put.status, 200, put.text);
    t.same(put.body.permissions, { contents: 'write' });
    t.equal((await host.call('PUT', '/v1/repohost/grants/gz-ok', { body: { name: 'gz-ok' } })).status, 200, 'the name alone changes nothing');
    const renamed = await host.call('PUT', '/v1/repohost/grants/gz-ok', { body: { name: 'other', permissions: {} } });
    expectError(t, renamed, 400, 'invalid_argument', 'another name');
    t.same(renamed.body.error.details.map((d: any) => d.field), ['name']);
    t.equal((await host.call('GET', '/v1/repohost/grants/other')).status, 404, 'not renamed');
    t.same((await host.call('GET', '/v1/repohost/grants/gz-ok')).body.permissions, { contents: 'write' }, 'unchanged by the refused PUT');
    for (const g of ['gz-ok', 'cs-ok']) await host.call('DELETE', `/v1/repohost/grants/${g}`);
    t.same(await rows(), rowsBefore, 'no operation or box row was made by any of it');
  });

  t.test('WebSocket handshakes are refused before the upgrade', async (t) => {
    const limited = await host.call('POST', '/v1/tokens', { body: { name: 'ws-limited', projects: ['alpha'] } });
    for (const p of ['/v1/projects/alpha/boxes/web/exec/ws', '/v1/projects/alpha/boxes/nobox/console', '/no-such-route', '/healthz']) {
      for (const token of [undefined, 'bxh_wrong']) {
        const r = await handshake(host.url, p, token);
        t.notOk(r.upgraded, `${p} without a valid token: no upgrade`);
        t.equal(r.status, 401, `${p} without a valid token → 401`);
        t.equal(r.body?.error?.code, 'unauthenticated');
        t.same(r.body?.error?.details, []);
      }
      // exec/ws without a command is a bad request; a console of a box that does not exist, and
      // paths with no WebSocket route, are 404 — all before any upgrade.
      const [status, code] = p.endsWith('/exec/ws') ? [400, 'invalid_argument'] : [404, 'not_found'];
      for (const token of [host.adminToken, limited.body.token]) {
        const r = await handshake(host.url, p, token);
        t.notOk(r.upgraded, `${p}: no upgrade`);
        t.equal(r.status, status, `${p} with a token → ${status}`);
        t.equal(r.body?.error?.code, code);
        t.ok(r.headers['x-request-id']);
      }
    }
    t.equal((await host.call('GET', '/v1/tokens')).status, 200, 'the server still serves HTTP');

    // Positive control: express-ws behind the same guard, with a route registered: a handshake
    // with a valid token is upgraded and reaches it; one without is still 401.
    const app = express();
    const server = http.createServer(app);
    const ws = expressWs(app, server);
    ws.app.ws('/v1/test/:name/ws', (socket) => socket.send('hello'));
    guardUpgrades(server, host.api!);
    websocketRoutes.push('/v1/test/{name}/ws');
    t.teardown(() => {
      websocketRoutes.splice(websocketRoutes.indexOf('/v1/test/{name}/ws'), 1);
      server.close();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    const ok = await handshake(url, '/v1/test/x/ws', host.adminToken);
    t.ok(ok.upgraded, 'a WebSocket route with a valid token is upgraded');
    t.equal(ok.status, 101);
    t.equal((await handshake(url, '/v1/test/x/ws')).status, 401, 'the same route without a token → 401');
    t.equal((await handshake(url, '/v1/test/x/other', host.adminToken)).status, 404, 'another path → 404');
  });

  t.test('errors a project token reads carry no host command, path or stderr', async (t) => {
    const P = '/v1/projects/leaks/boxes';
    const limited = (await host.call('POST', '/v1/tokens', { body: { name: 'leaks-reader', projects: ['leaks'] } })).body.token as string;
    const created = await host.call('POST', `${P}?wait=60`, { body: { name: 'src', config: { ram_mb: 64, storage_gb: 1 } } });
    t.equal(created.body.status, 'running', created.text);
    t.equal((await host.call('POST', `${P}/src/stop?wait=60`)).body.status, 'stopped');
    // Behind the api's back, the source's root loses its /proc directory (a file takes its
    // place): a fork of it is cloned fine, then runc cannot start the container.
    const root = host.node!.ctx.storage.boxRootPath(created.body.id);
    fs.rmSync(path.join(root, 'proc'), { recursive: true, force: true });
    fs.writeFileSync(path.join(root, 'proc'), 'not a directory\n');

    const fork = await host.call('POST', `${P}`, { body: { name: 'doomed', fork: 'src' } });
    t.equal(fork.status, 202, fork.text);
    const opId = fork.headers.get('operation-id')!;
    const op = (await host.call('GET', `/v1/operations/${opId}/wait?timeout=120`, { token: limited })).body;
    t.equal(op.status, 'failed', JSON.stringify(op));
    const box = (await host.call('GET', `${P}/doomed`, { token: limited })).body;
    t.equal(box.status, 'failed');
    for (const [what, text] of [['box error', box.error], ['operation error', op.error]] as const) {
      t.match(text, PUBLIC_TEXT, `${what} holds no path: ${text}`);
      t.notMatch(text, TOOL_WORDS, `${what} names no host tool and quotes no output: ${text}`);
    }
    t.match(box.error, /^create failed: the container runtime failed: a path has the wrong type \(exit status \d+\)$/, 'what failed, in plain words');
    const listed = (await host.call('GET', `${P}`, { token: limited })).body.boxes.find((b: any) => b.name === 'doomed');
    t.equal(listed.error, box.error, 'the list shows the same public text');
    // The node's log has it all, under the operation id.
    const logged = host.logs.filter((l) => l.op === opId && l.err);
    t.ok(logged.length > 0, 'the failure is logged with its operation id');
    t.ok(logged.some((l) => /runc/.test(JSON.stringify(l.err)) && /ordinary directory/.test(JSON.stringify(l.err))), 'the log line has the command and its output');

    t.equal((await host.call('DELETE', `${P}/doomed?wait=60`)).status, 204);
    fs.rmSync(path.join(root, 'proc'), { force: true });
    fs.mkdirSync(path.join(root, 'proc'));
    t.equal((await host.call('DELETE', `${P}/src?wait=60`)).status, 204);

    // A job whose host command fails: while it retries and once it has failed for good.
    const queued = await host.db.transaction((trx) => host.api!.queue.enqueue(trx, leakyJob.type.of({ tag: 'x' }), { resource: '/v1/test/leaky', node: host.config.nodeId, attempts: 2 }));
    let retrying: string | null = null;
    for (let i = 0; i < 100 && !retrying; i++) {
      const e = (await host.call('GET', `/v1/operations/${queued.id}`)).body.error as string | null;
      if (e?.startsWith('retrying: ')) retrying = e;
      else await sleep(50);
    }
    t.equal(retrying, 'retrying: a host tool failed: permission denied on the node (exit status 3)');
    const done = (await host.call('GET', `/v1/operations/${queued.id}/wait?timeout=30`)).body;
    t.equal(done.status, 'failed');
    t.equal(done.error, 'a host tool failed: permission denied on the node (exit status 3)');
    t.ok(host.logs.some((l) => l.op === queued.id && /cluster-secret/.test(JSON.stringify(l.err))), 'the stderr is in the log');
  });

  t.test('publicReason: the shapes drivers throw', async (t) => {
    const errno = Object.assign(new Error("ENOTDIR: not a directory, mkdir '/var/tmp/bh/bundles/b1'"), { code: 'ENOTDIR', syscall: 'mkdir', path: '/var/tmp/bh/bundles/b1', errno: -20 });
    t.equal(publicReason(errno), 'a file operation on the node failed: a path has the wrong type (ENOTDIR)');
    // The host helper's operations name the part of the node they belong to (core/spawner.ts).
    const helperErr = (syscall: string, code: string) => Object.assign(new Error(`bridge bh1234-3: ${code}`), { code, syscall, errno: -1 });
    t.equal(publicReason(helperErr('box-net', 'EEXIST')), 'the network set-up failed: something it makes already exists (EEXIST)');
    t.equal(publicReason(helperErr('nft-elements', 'ENOENT')), 'the network set-up failed: something it needs does not exist (ENOENT)');
    t.equal(publicReason(helperErr('remount-private', 'EPERM')), 'storage failed: permission denied on the node (EPERM)');
    t.equal(publicReason(new Error('runc exec failed: open /run/bh/x.pid: no such file')), 'runc exec failed: open … no such file');
    t.equal(publicReason(new Error("create failed: /usr/sbin/zfs clone -o refquota=1G a b exited 1: cannot open '/x'")), 'create failed: a host tool exited 1');
    t.equal(publicReason(new Error('cni bridge: no such device')), 'cni bridge: no such device', 'our own words pass as they are');
    t.equal(publicReason('plain string'), 'plain string');
  });

  t.test('OpenAPI document lists every mounted route', async (t) => {
    const doc = (await host.call('GET', '/openapi.json', { token: null })).body;
    t.equal(doc.openapi, '3.1.0');
    // Read the routes off the running express app itself, not off the list the document came from.
    const mounted: string[] = [];
    const walk = (stack: any[]) => {
      for (const layer of stack) {
        if (layer.route) for (const m of Object.keys(layer.route.methods)) mounted.push(`${m} ${layer.route.path}`);
        else if (layer.handle?.stack) walk(layer.handle.stack);
      }
    };
    walk((host.app as any).router.stack);
    t.ok(mounted.length >= routes.length, `${mounted.length} routes mounted`);
    const documented = new Set<string>();
    for (const [p, methods] of Object.entries<any>(doc.paths)) for (const m of Object.keys(methods)) documented.add(`${m} ${expressPath(p)}`);
    for (const r of mounted) t.ok(documented.has(r), `${r} is in the OpenAPI document`);
  });

  t.test('metrics', async (t) => {
    const m = await host.call('GET', '/metrics', { token: null });
    t.equal(m.status, 200);
    t.match(m.text, /boxhost_http_request_duration_seconds_bucket\{.*route="\/v1\/tokens"/);
    t.match(m.text, /boxhost_queue_jobs\{node="local",state="wait"\} \d+/);
  });
});

t.test('bad configuration stops with one line naming the variable', async (t) => {
  const { spawnSync } = await import('node:child_process');
  const main = require.resolve('../server/main');
  const r = spawnSync(process.execPath, [main], { env: { ...process.env, BOXHOST_PORT: 'eighty' }, encoding: 'utf8' });
  t.equal(r.status, 2);
  t.match(r.stderr.trim(), /^boxhost: invalid BOXHOST_PORT="eighty": must be a number$/);
  t.equal(r.stderr.trim().split('\n').length, 1);
  // A host name where addresses are wanted: refused the same way, whatever BOXHOST_BOX_OUTBOUND says.
  const nets = spawnSync(process.execPath, [main], { env: { ...process.env, BOXHOST_PROTECTED_NETS: '10.0.0.0/8, example.com' }, encoding: 'utf8' });
  t.equal(nets.status, 2);
  t.match(nets.stderr.trim(), /^boxhost: invalid BOXHOST_PROTECTED_NETS=".*": example\.com is not an address or CIDR$/);
});

t.test('auth settings say configured when an identity provider is set', async (t) => {
  const config = testConfig({ BOXHOST_OIDC_ISSUER: 'https://idp.example.com', BOXHOST_OIDC_CLIENT_ID: 'boxhost', BOXHOST_OIDC_CLIENT_SECRET: 's3cret' });
  const host = await startHost(config, { roles: ['api'] });
  t.teardown(async () => {
    await host.close();
    fs.rmSync(config.dataDir, { recursive: true, force: true });
  });
  const r = await request(host.url!, 'GET', '/v1/auth/settings', host.adminToken);
  t.equal(r.body.configured, true);
  t.equal(r.body.idp_auth_client_url, 'https://idp.example.com');
  const mode = fs.statSync(`${config.dataDir}/admin-token`).mode & 0o777;
  t.equal(mode, 0o600, 'generated admin token file is private');
});

t.test('rate limits per token on Redis, shared by api processes; public routes are not limited', async (t) => {
  // 1 request a second and a burst of 5 over it per caller.
  const host = await startTestHost(t, { BOXHOST_RATE_LIMIT_RPS: '1', BOXHOST_RATE_LIMIT_BURST: '5' }, { roles: ['api'] });
  const other = (await host.call('POST', '/v1/tokens', { body: { name: 'other' } })).body.token as string;
  t.ok(other, 'a second token');
  // A second api process on the same Redis, started before the burst: its start can take
  // seconds on a loaded machine, long enough for the token's allowance to come back.
  const second = await startHost(host.config, { roles: ['api'] });
  t.teardown(() => second.close());
  await sleep(1100); // a fresh window for the admin token's sustained rate

  const burst = await Promise.all(Array.from({ length: 20 }, () => host.call('GET', '/v1/tokens')));
  const ok = burst.filter((r) => r.status === 200).length;
  const limited = burst.filter((r) => r.status === 429);
  t.ok(ok >= 5 && ok <= 7, `${ok} of 20 passed (1/s + a burst of 5)`);
  t.equal(ok + limited.length, 20, 'the others are 429');
  for (const r of limited) {
    t.equal(r.body.error.code, 'rate_limited');
    t.same(r.body.error.details, []);
    t.match(r.headers.get('retry-after'), /^[1-9]\d*$/, 'Retry-After in whole seconds');
  }
  const wait = Number(limited[0].headers.get('retry-after'));
  t.ok(wait >= 1 && wait <= 5, `Retry-After ${wait} s`);
  // The second process sees the same count, right after the burst.
  const there = await request(second.url!, 'GET', '/v1/tokens', host.adminToken);
  t.equal(there.status, 429, 'the limit holds on another api process');

  t.equal((await host.call('GET', '/v1/tokens', { token: other })).status, 200, 'another token is not affected');
  for (const p of ['/version', '/healthz', '/metrics', '/openapi.json']) {
    const rs = await Promise.all(Array.from({ length: 10 }, () => host.call('GET', p, { token: null })));
    t.notOk(rs.some((r) => r.status === 429), `${p} is never limited`);
  }

  const redis = new IORedis(redisOptions(host.config));
  t.teardown(() => redis.disconnect());
  t.ok((await redis.keys(`${host.config.redisPrefix}:ratelimit:*`)).length > 0, 'the counters are in Redis');

  // Without a valid token: counted per client address, before the 401.
  const anon = await Promise.all(Array.from({ length: 20 }, (_, i) => host.call('GET', '/v1/tokens', { token: i % 2 ? null : 'bxh_guess' })));
  t.ok(anon.some((r) => r.status === 401), 'some are told the token is wrong');
  t.ok(anon.some((r) => r.status === 429 && r.headers.get('retry-after')), 'guessing is rate limited too');

  await sleep(wait * 1000 + 100);
  t.equal((await host.call('GET', '/v1/tokens')).status, 200, 'after Retry-After the token is served again');
});
