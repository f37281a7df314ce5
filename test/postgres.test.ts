import fs from 'node:fs';
import t from 'tap';
import knex from 'knex';
import { randomId, sha256 } from '../core/ids';
import { startHost } from '../server/host';
import { request, testConfig } from './helpers/host';

const PG = process.env.BOXHOST_TEST_PG ?? 'postgres://root@127.0.0.1:5432/test';

t.test('the db layer on PostgreSQL: same migrations, tokens, grants, settings', async (t) => {
  const schema = `bh_test_${randomId(8)}`;
  const admin = knex({ client: 'pg', connection: PG });
  await admin.raw(`create schema ${schema}`);
  t.teardown(async () => {
    await admin.raw(`drop schema ${schema} cascade`);
    await admin.destroy();
  });
  const url = `${PG}?options=${encodeURIComponent(`-c search_path=${schema}`)}`;
  const config = testConfig({ DATABASE_URL: url });
  const host = await startHost(config, { roles: ['api'] });
  t.teardown(async () => {
    await host.close();
    fs.rmSync(config.dataDir, { recursive: true, force: true });
  });
  const call = (m: string, p: string, body?: unknown, token = host.adminToken) => request(host.url!, m, p, token, { body });

  const tables = (await admin('information_schema.tables').where({ table_schema: schema }).pluck('table_name')).sort();
  t.same(tables.filter((x: string) => !x.startsWith('knex')), ['base_build_logs', 'base_builds', 'bases', 'boxes', 'data_attachments', 'data_backups', 'data_evictions', 'data_volumes', 'deploy_generations', 'deploy_lines', 'env_links', 'events', 'grants', 'instance_secrets', 'nodes', 'operations', 'pack_revisions', 'packs', 'projects', 'publishes', 'settings', 'tokens', 'webhooks']);

  const tok = await call('POST', '/v1/tokens', { name: 'pg-token', projects: ['p1'], expires_in: 3600 });
  t.equal(tok.status, 201);
  const row = await admin(`${schema}.tokens`).where({ id: tok.body.id }).first();
  t.equal(row.secret_hash, sha256(tok.body.token));
  t.equal((await call('GET', '/v1/operations/op_none', undefined, tok.body.token)).status, 404, 'the new token authenticates');
  t.equal((await call('GET', '/v1/tokens', undefined, tok.body.token)).status, 403, 'project-limited');

  t.equal((await call('POST', '/v1/repohost/grants', { name: 'g1', permissions: { contents: 'read' }, repositories: ['a/b'] })).status, 201);
  t.equal((await call('POST', '/v1/repohost/grants', { name: 'g1', permissions: {}, repositories: [] })).status, 409, 'unique violation maps to 409 on pg too');
  const s = await call('PUT', '/v1/auth/settings', { allowed_emails: ['a@example.com'] });
  t.same(s.body.settings.allowed_emails, ['a@example.com']);
  t.same((await call('GET', '/v1/auth/settings')).body.settings.allowed_emails, ['a@example.com']);
});
