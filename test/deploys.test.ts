import http from 'node:http';
import path from 'node:path';
import { execFile } from 'node:child_process';
import t from 'tap';
import type { Test } from 'tap';
import { startTestHost } from './helpers/host';

/**
 * Deploy generations on a real host (docs/packs.md "Deploy generations"): a deploy of another
 * revision under a continuous request loop through the publish proxy loses no request, the line's
 * host moves to the new generation, the one it replaced is stopped after the drain and kept; a
 * rollback switches back the same way; the next deploy deletes what the line no longer needs; a
 * deploy whose ready gate fails leaves the line where it was; every refusal (not an instance, a
 * dev instance, a token without the deploy scope, an unknown revision, a deploy under way, nothing
 * to roll back to); `box deploy` and `box rollback`.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A revision whose one service answers `text` on / (the same base for every revision). */
const revision = (text: string, extra: object = {}) => ({
  base: 'site-base',
  parent: 'busybox',
  script: 'mkdir -p /srv',
  services: [{
    name: 'web',
    command: ['sh', '-c', `mkdir -p /run/www && echo ${text} > /run/www/index.html && exec httpd -f -p 8080 -h /run/www`],
    port: 8080,
    ready: { http: '/index.html', timeout_secs: 30 },
    publish: { name: 'web' },
  }],
  outputs: { REV: '{{rev}}', NAME: '{{name}}', TEXT: text, PASS: '{{secret.pw}}', ...(text === 'v2' ? { EXTRA: 'from-v2' } : {}) },
  ...extra,
});

const manifest = (defaultRev: string) => ({
  name: 'site',
  default_rev: defaultRev,
  revisions: {
    v1: revision('v1'),
    v2: revision('v2'),
    // Its gate waits on a port nothing opens: its deploy fails.
    bad: { ...revision('bad'), services: [{ name: 'web', command: ['sleep', '600'], port: 8080, ready: { tcp: 8080, timeout_secs: 2 }, publish: { name: 'web' } }] },
  },
});

/** Requests through the proxy one after another until stopped: every answer, in order. */
function requestLoop(proxyUrl: string, host: string) {
  const u = new URL(proxyUrl);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const answers: { status: number; body: string }[] = [];
  let running = true;
  const get = () => new Promise<{ status: number; body: string }>((resolve) => {
    const req = http.request({ host: u.hostname, port: u.port, path: '/index.html', agent, headers: { host } }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: body.trim() }));
    });
    req.on('error', (e) => resolve({ status: 0, body: e.message }));
    req.end();
  });
  const done = (async () => {
    while (running) {
      answers.push(await get());
      await sleep(5);
    }
  })();
  return {
    answers,
    stop: async () => {
      running = false;
      await done;
      agent.destroy();
      return answers;
    },
  };
}

/** The bodies in order with repeats collapsed: [v1, v2] is one switch. */
const runs = (answers: { body: string }[]) => answers.map((a) => a.body).filter((b, i, all) => i === 0 || all[i - 1] !== b);

t.test('deploy generations on a real host', async (t) => {
  const host = await startTestHost(t, { BOXHOST_DEPLOY_DRAIN_SECS: '2' });
  const call = (method: string, p: string, body?: unknown, token?: string) => host.call(method, p, { body, ...(token !== undefined ? { token } : {}) });
  const P = '/v1/projects/dp/boxes';
  const proxyUrl = host.proxyUrl!;
  const siteHost = 'web--site1--dp.localhost';
  /** What the line's host serves through the proxy now. */
  const servedText = () => new Promise<string>((resolve) => {
    const u = new URL(proxyUrl);
    http.get({ host: u.hostname, port: u.port, path: '/index.html', headers: { host: siteHost } }, (res) => {
      let b = '';
      res.on('data', (c) => (b += c));
      res.on('end', () => resolve(b.trim()));
    });
  });
  const status = async (name: string) => (await call('GET', `${P}/${name}`)).body.status as string | undefined;
  let pass = '';
  const until = async (t: Test, what: string, ok: () => Promise<boolean>, ms = 60_000) => {
    for (const end = Date.now() + ms; Date.now() < end; await sleep(200)) if (await ok()) return true;
    t.fail(`timed out: ${what}`);
    return false;
  };

  t.equal((await call('POST', '/v1/packs', manifest('v1'))).status, 201);
  const revs = (await call('GET', '/v1/packs/site')).body.revisions;
  const first = await call('POST', `${P}?wait=180`, { name: 'site1', pack: 'site' });
  t.equal(first.status, 200, first.text);
  t.match(first.body, { status: 'running', pack_rev: revs.v1.rev, lifecycle: null, rollback_to: null });

  t.test('refusals', async (t) => {
    t.equal((await call('POST', `${P}?wait=60`, { name: 'plain' })).status, 200);
    const plain = await call('POST', `${P}/plain/deploy`, {});
    t.equal(plain.status, 409, 'a box that is not an instance');
    t.match(plain.body.error, { code: 'conflict', message: /not a pack instance/ });
    const dev = await call('POST', `${P}?wait=60`, { name: 'devsite', pack: 'site', lifecycle: 'dev' });
    t.equal(dev.status, 200, dev.text);
    t.equal((await call('POST', `${P}/devsite/deploy`, {})).status, 409, 'a dev instance');
    const rev = await call('POST', `${P}/site1/deploy`, { rev: 'v9' });
    t.equal(rev.status, 400, 'an unknown revision');
    t.equal(rev.body.error.details[0].field, 'rev');
    t.equal((await call('POST', `${P}/site1/rollback`, {})).status, 409, 'never deployed: nothing to roll back to');
    const plainToken = (await call('POST', '/v1/tokens', { name: 'dp-plain', projects: ['dp'] })).body.token;
    const forbidden = await call('POST', `${P}/site1/deploy`, {}, plainToken);
    t.equal(forbidden.status, 403, 'a project token without the deploy scope');
    const otherToken = (await call('POST', '/v1/tokens', { name: 'other-deployer', projects: ['other'], scopes: ['deploy'] })).body.token;
    t.equal((await call('POST', `${P}/site1/deploy`, {}, otherToken)).status, 404, "another project's deploy token does not see the box");
    const badScope = await call('POST', '/v1/tokens', { name: 'x', scopes: ['root'] });
    t.equal(badScope.status, 400, 'an unknown scope');
    t.equal((await call('POST', `${P}`, { name: 'x1', pack: 'site', lifecycle: 'deploy' })).status, 400, 'the public create still refuses deploy');
    for (const b of ['plain', 'devsite']) await call('DELETE', `${P}/${b}?wait=60`);
    // A consumer of the line's outputs, made while site1 (v1) is live; its own SITE_TEXT wins.
    const client = await call('POST', `${P}?wait=60`, { name: 'client', env_from: [{ alias: 'site', box: 'site1' }], environment: { SITE_TEXT: 'mine', SITE_EXTRA: 'mine too' } });
    t.match(client.body.environment, { SITE_REV: revs.v1.rev, SITE_NAME: 'site1', SITE_TEXT: 'mine', SITE_EXTRA: 'mine too', SITE_PASS: /^[A-Za-z0-9_-]{32}$/ });
    pass = client.body.environment.SITE_PASS;
    const clash = await call('POST', P, { name: 'client2', env_from: [{ alias: 'site', box: 'site1' }, { alias: 'SITE', box: 'site1' }] });
    t.equal(clash.status, 400, 'two aliases that name the same variables');
    t.equal(clash.body.error.details[0].field, 'env_from.1.alias');
    const many = await call('POST', P, { name: 'client3', env_from: Array.from({ length: 17 }, (_, i) => ({ alias: `s${i}x`, box: 'site1' })) });
    t.equal(many.status, 400, 'at most 16 env_from entries');
    t.equal(many.body.error.details[0].field, 'env_from');
    t.equal((await call('GET', `${P}/site1`)).body.status, 'running', 'the refusals left the instance as it was');
  });

  t.test('a deploy under a request loop loses no request; the replaced generation is stopped after the drain', async (t) => {
    const loop = requestLoop(proxyUrl, siteHost);
    await sleep(500);
    const deploy = await call('POST', `${P}/site1/deploy`, { rev: 'v2' });
    t.equal(deploy.status, 202, deploy.text);
    t.match(deploy.body, { name: 'site1-g2', status: 'creating', pack: 'site', pack_rev: revs.v2.rev, lifecycle: 'deploy', rollback_to: 'site1' });
    const again = await call('POST', `${P}/site1/deploy`, { rev: 'v2' });
    t.equal(again.status, 409, 'a second deploy while one is under way');
    const op = (await call('GET', `/v1/operations/${deploy.headers.get('operation-id')}/wait?timeout=180`)).body;
    t.match(op, { status: 'succeeded', kind: 'pack.deploy' });
    await until(t, 'the old generation is stopped', async () => (await status('site1')) === 'stopped');
    await sleep(1500);
    const answers = await loop.stop();
    t.ok(answers.length > 50, `${answers.length} requests`);
    const bad = answers.filter((a) => a.status !== 200);
    t.same(bad, [], 'every request answered 200');
    t.same(runs(answers), ['v1', 'v2'], 'v1 until the switch, v2 after it, never back');
    const g2 = (await call('GET', `${P}/site1-g2`)).body;
    t.match(g2, { status: 'running', lifecycle: 'deploy', pack_rev: revs.v2.rev, rollback_to: 'site1' });
    t.match(g2.publishes, [{ name: 'web', host: siteHost }], "the line's host is the new generation's");
    t.same((await call('GET', `${P}/site1`)).body.publishes, [], 'and no longer the old one\'s');
  });

  t.test("env_from: a consumer gets the line's new outputs at its next start", async (t) => {
    t.match((await call('GET', `${P}/client`)).body.environment, { SITE_REV: revs.v1.rev, SITE_NAME: 'site1' }, 'not before');
    t.equal((await call('POST', `${P}/client/stop?wait=60`)).body.status, 'stopped');
    t.equal((await call('POST', `${P}/client/resume?wait=60`)).body.status, 'running');
    t.match((await call('GET', `${P}/client`)).body.environment, { SITE_REV: revs.v2.rev, SITE_NAME: 'site1-g2', SITE_TEXT: 'mine', SITE_EXTRA: 'mine too', SITE_PASS: pass },
      "the live generation; the own variables kept, also one the new revision's outputs now name; the line's secret the same");
    const seen = await call('POST', `${P}/client/exec`, { command: ['sh', '-c', '. /etc/boxes-env; echo $SITE_NAME $SITE_TEXT'] });
    t.equal(seen.body.stdout, 'site1-g2 mine\n', 'in the box');
    t.equal((await call('DELETE', `${P}/client?wait=60`)).status < 300, true);
  });

  t.test('a rollback (by a project token with the deploy scope) switches back the same way', async (t) => {
    const deployer = (await call('POST', '/v1/tokens', { name: 'dp-deployer', projects: ['dp'], scopes: ['deploy'] })).body;
    t.same(deployer.scopes, ['deploy']);
    const loop = requestLoop(proxyUrl, siteHost);
    await sleep(500);
    const back = await call('POST', `${P}/site1-g2/rollback?wait=180`, {}, deployer.token);
    t.equal(back.status, 200, back.text);
    t.match(back.body, { name: 'site1', status: 'running' });
    await until(t, 'the rolled-back generation is stopped', async () => (await status('site1-g2')) === 'stopped');
    await sleep(1500);
    const answers = await loop.stop();
    t.same(answers.filter((a) => a.status !== 200), [], 'every request answered 200');
    t.same(runs(answers), ['v2', 'v1']);
    t.match((await call('GET', `${P}/site1`)).body.publishes, [{ host: siteHost }]);
    t.equal((await call('POST', `${P}/site1/rollback`, {})).status, 409, 'site1 has no earlier generation');
  });

  t.test('a deploy whose gate fails leaves the line where it was; the failed generation is stopped', async (t) => {
    const failed = await call('POST', `${P}/site1/deploy?wait=120`, { rev: 'bad' });
    t.equal(failed.body.name, 'site1-g3');
    const op = (await call('GET', `/v1/operations/${failed.headers.get('operation-id')}`)).body;
    t.match(op, { status: 'failed', error: /service web/ });
    await until(t, 'the failed generation is stopped', async () => (await status('site1-g3')) === 'stopped');
    const served = await servedText();
    t.equal(served, 'v1', 'the line still serves from site1');
  });

  t.test('box deploy (the default revision) deletes what the line no longer needs; box rollback', async (t) => {
    t.equal((await call('POST', '/v1/packs', manifest('v2'))).status, 201);
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'dp' };
    const box = (...args: string[]) => new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? ((err as any).code ?? 1) : 0, stdout, stderr }));
    });
    const d = await box('deploy', 'site1', '--wait', '--json');
    t.equal(d.code, 0, d.stderr);
    t.match(JSON.parse(d.stdout), { status: 'succeeded', kind: 'pack.deploy' });
    const g4 = (await call('GET', `${P}/site1-g4`)).body;
    t.match(g4, { status: 'running', pack_rev: revs.v2.rev, rollback_to: 'site1' });
    await until(t, 'the generations the line no longer needs are deleted', async () =>
      (await call('GET', `${P}/site1-g2`)).status === 404 && (await call('GET', `${P}/site1-g3`)).status === 404);
    await until(t, 'the replaced generation is stopped', async () => (await status('site1')) === 'stopped');
    const r = await box('rollback', 'site1-g4', '--wait');
    t.equal(r.code, 0, r.stderr);
    t.match(r.stdout, /rolled back to site1/);
    await until(t, 'g4 is stopped', async () => (await status('site1-g4')) === 'stopped');
  });

  t.test('a rollback asked while the replaced generation drains takes the line back', async (t) => {
    const d = await call('POST', `${P}/site1/deploy?wait=120`, {});
    t.match(d.body, { name: 'site1-g5', status: 'running' });
    // At once: site1 is still serving its drain (2 s) when the rollback is asked.
    t.equal(await status('site1'), 'running', 'site1 is still draining');
    const back = await call('POST', `${P}/site1/rollback?wait=120`, {});
    t.equal(back.status, 200, back.text);
    t.match(back.body, { name: 'site1', status: 'running' });
    await until(t, 'g5 is stopped', async () => (await status('site1-g5')) === 'stopped');
    await sleep(2500);
    t.equal(await status('site1'), 'running', 'the drain of the deploy did not stop the box the line went back to');
    const served = await servedText();
    t.equal(served, 'v1');
    t.equal((await call('GET', `${P}/site1-g4`)).status, 404, 'the generation before was deleted by the deploy');
    const taken = await call('POST', P, { name: 'site1-g9' });
    t.equal(taken.status, 202, 'a name like a generation is any box name');
    await call('GET', `/v1/operations/${taken.headers.get('operation-id')}/wait?timeout=60`);
  });

  t.test('clean-up: deleting the live box ends the line', async (t) => {
    t.equal((await call('DELETE', `${P}/site1-g5?wait=60`)).status, 204, 'a stopped generation is deleted');
    const reuse = await call('POST', P, { name: 'site1-g5' });
    t.equal(reuse.status, 202);
    await call('GET', `/v1/operations/${reuse.headers.get('operation-id')}/wait?timeout=60`);
    const stepped = await call('POST', `${P}/site1/deploy?wait=120`, {});
    t.equal(stepped.body.name, 'site1-g6', 'a box left with the next generation\'s name is stepped over');
    t.equal((await call('DELETE', `${P}/site1?wait=60`)).status < 300, true, 'the line lost its old generation');
    t.equal((await call('POST', P, { name: 'site1', pack: 'site' })).status, 409, "a new box cannot take the name of a line that lives on");
    for (const b of ['site1-g6', 'site1-g9', 'site1-g5']) t.ok((await call('DELETE', `${P}/${b}?wait=60`)).status < 300);
    t.same((await call('GET', P)).body.boxes, []);
    t.equal((await call('DELETE', '/v1/packs/site')).status, 204);
  });
});
