import t from 'tap';
import { sha256 } from '../core/ids';
import { routes } from '../api/routes';
import { expressPath } from '../api/http/route';
import { request, startTestHost, testConfig } from './helpers/host';
import { startHost } from '../server/host';
import fs from 'node:fs';

t.test('backbone over real HTTP (sqlite file, embedded Redis)', async (t) => {
  const host = await startTestHost(t);

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
    }
    const malformed = await host.call('GET', '/v1/tokens', { token: null, headers: { authorization: 'Basic abc' } });
    t.equal(malformed.status, 401);
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

    const unknown = await host.call('GET', '/v1/nothing-here');
    t.equal(unknown.status, 404);
    t.equal(unknown.body.error.code, 'not_found');

    const big = await host.call('POST', '/v1/repohost/grants', {
      raw: JSON.stringify({ name: 'big', permissions: {}, repositories: [], pad: 'x'.repeat(1024 * 1024 + 10) }),
    });
    t.equal(big.status, 413);
    t.equal(big.body.error.code, 'payload_too_large');

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
    t.equal((await host.call('DELETE', '/v1/repohost/grants/deploy-keys')).status, 204);
    t.equal((await host.call('GET', '/v1/repohost/grants/deploy-keys')).status, 404);
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
