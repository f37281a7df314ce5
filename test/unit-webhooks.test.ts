/**
 * Where webhooks may be sent (core/addressPolicy.ts) and the delivery's own guard
 * (api/webhooks.ts `post`): loopback, private, link-local, reserved and IPv4-mapped addresses are
 * refused unless a configured network allows them; a name is refused when it resolves only to
 * such addresses (nothing is sent); the signature is HMAC-SHA256 over `<timestamp>.<body>`.
 */
import crypto from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { AddressPolicy, cidrError } from '../core/addressPolicy';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { post, signature } from '../api/webhooks';
import { createDb, migrate } from '../db/knex';
import { webhooksRepo } from '../db/repos/webhooks';

t.test('the policy', async (t) => {
  const p = new AddressPolicy();
  for (const a of ['127.0.0.1', '10.1.2.3', '172.16.0.1', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255', '::1', '::', 'fe80::1', 'fd00::1', '::ffff:127.0.0.1', '::ffff:10.0.0.1']) {
    t.ok(p.refusal(a), `${a} refused`);
  }
  for (const a of ['93.184.216.34', '1.1.1.1', '2606:4700:4700::1111', '::ffff:8.8.8.8']) t.equal(p.refusal(a), null, `${a} allowed`);
  t.ok(p.refusal('not-an-ip'));
  const allowing = new AddressPolicy({ allow: ['127.0.0.1/32', '10.9.0.0/16'] });
  t.equal(allowing.refusal('127.0.0.1'), null, 'an allowed network');
  t.equal(allowing.refusal('10.9.3.4'), null);
  t.ok(allowing.refusal('127.0.0.2'), 'only what it names');
  t.ok(allowing.refusal('10.8.0.1'));
  const platform = new AddressPolicy({ platform: ['10.88.0.0/16', '8.8.8.8'], allow: ['10.0.0.0/8'] });
  t.ok(platform.refusal('10.88.1.2'), "the boxes' subnet stays refused when a wider network is allowed");
  t.ok(platform.refusal('8.8.8.8'), "a platform host on a public address");
  t.equal(platform.refusal('10.1.2.3'), null, 'the rest of the allowed network');
  for (const a of ['2002:7f00:1::1', '2001:0:4136:e378::1', '64:ff9b:1::7f00:1', '::7f00:1']) t.ok(p.refusal(a), `${a} (an IPv4 carried in IPv6) refused`);
  t.equal(cidrError('10.0.0.0/8'), null);
  t.equal(cidrError('::1'), null);
  t.ok(cidrError('10.0.0.0/33'));
  t.ok(cidrError('example.com'));
});

t.test('a delivery goes only where the policy allows', async (t) => {
  let hits = 0;
  const server = http.createServer((_req, res) => {
    hits++;
    res.writeHead(204).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise((r) => server.close(r)));
  const port = (server.address() as AddressInfo).port;
  const strict = new AddressPolicy();
  await t.rejects(post(new URL(`http://127.0.0.1:${port}/`), '{}', {}, strict), /loopback/, 'an address literal');
  await t.rejects(post(new URL(`http://localhost:${port}/`), '{}', {}, strict), /localhost: .*loopback/, 'a name that resolves to loopback');
  t.equal(hits, 0, 'nothing was sent');
  const open = new AddressPolicy({ allow: ['127.0.0.1/32'] });
  t.equal(await post(new URL(`http://127.0.0.1:${port}/`), '{}', {}, open), 204, 'allowed: sent');
  t.equal(hits, 1);
});

t.test('the signature', async (t) => {
  const body = '{"kind":"verb"}';
  t.equal(signature('s3cret', '1700000000', body), `v1=${crypto.createHmac('sha256', 's3cret').update(`1700000000.${body}`).digest('hex')}`);
  t.not(signature('s3cret', '1700000001', body), signature('s3cret', '1700000000', body), 'the timestamp is signed');
});

t.test('a run of failed deliveries disables a webhook; a success ends the run', async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-wh-'));
  const db = createDb({ dataDir, databaseUrl: undefined });
  t.teardown(async () => {
    await db.destroy();
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
  await migrate(db);
  await webhooksRepo.insert(db, {
    id: 'wh_1', url: 'http://x.example/', project: 'p', kinds: null, secret: 's', after_seq: 0, created_by: 'a', token_id: null, failures: 0, disabled_at: null,
    created_at: new Date().toISOString(), last_attempt_at: null, last_success_at: null, last_status: null, last_error: null,
  });
  for (let i = 0; i < 3; i++) await webhooksRepo.recordOutcome(db, 'wh_1', false, 5, 't1');
  await webhooksRepo.recordOutcome(db, 'wh_1', true, 5, 't2');
  t.match(await webhooksRepo.get(db, 'wh_1'), { failures: 0, disabled_at: null }, 'a success resets the run');
  for (let i = 0; i < 4; i++) await webhooksRepo.recordOutcome(db, 'wh_1', false, 5, 't3');
  t.equal((await webhooksRepo.get(db, 'wh_1'))!.disabled_at, null, 'four in a row: still on');
  await webhooksRepo.recordOutcome(db, 'wh_1', false, 5, 't4');
  t.equal((await webhooksRepo.get(db, 'wh_1'))!.disabled_at, 't4', 'the fifth disables it');
});
