import crypto from 'node:crypto';
import path from 'node:path';
import { execFile } from 'node:child_process';
import t from 'tap';
import { startTestHost } from './helpers/host';

/**
 * Base builds on a real host (docs/bases.md "Builds"): the two forms (both or neither → 400, the
 * pack form of a pack that is not installed → 404; test/packs.test.ts builds from one), a build that runs its script in a temporary box and saves
 * it with DESIGN.md §6's version, its log (streamed with follow), the same inputs cached, force
 * (refused while a box uses the version, then rebuilt), a failing script leaving nothing, the CLI.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');

t.test('base builds on a real host', async (t) => {
  const host = await startTestHost(t);
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const waitOp = async (r: { status: number; headers: Headers; text: string }) => {
    if (r.status !== 202) throw new Error(`not accepted: ${r.status} ${r.text}`);
    return (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=180`)).body;
  };
  const busybox = (await call('GET', '/v1/bases/busybox')).body.version as string;
  const versionOf = (script: string) => crypto.createHash('sha256').update(`busybox@${busybox}\n${script}`).digest('hex').slice(0, 12);
  const buildBoxes = async () => ((await call('GET', '/v1/projects/base-builds/boxes')).body?.boxes ?? []).map((b: any) => b.name);

  t.test('the forms: both or neither → 400, an unknown pack → 404, an unknown parent → 400', async (t) => {
    for (const bad of [{}, { pack: 'p', base: 'x', parent: 'busybox', script: 'true' }, { base: 'x', parent: 'busybox' }, { base: 'x', script: 'true' }, { parent: 'busybox', script: 'true' }, { base: 'X', parent: 'busybox', script: 'true' }]) {
      const r = await call('POST', '/v1/base-builds', bad);
      t.equal(r.status, 400, `400 for ${JSON.stringify(bad)}: ${r.text.slice(0, 100)}`);
      t.equal(r.body.error.code, 'invalid_argument');
    }
    const pack = await call('POST', '/v1/base-builds', { pack: 'nope' });
    t.equal(pack.status, 404);
    t.equal(pack.body.error.code, 'not_found');
    t.match(pack.body.error.message, /pack nope/);
    t.equal((await call('POST', '/v1/base-builds', { base: 'x', parent: 'nope', script: 'true' })).status, 400);
    t.equal((await call('GET', '/v1/base-builds/bb_nope')).status, 404);
  });

  t.test("a new version asks for a GB of its project's storage quota, as a save does", async (t) => {
    t.equal((await call('PUT', '/v1/projects/bbfull', { quotas: { storage_gb: 0 } })).status, 200);
    const r = await call('POST', '/v1/base-builds', { base: 'bbfull-x', parent: 'busybox', script: 'true', project: 'bbfull' });
    t.equal(r.status, 429, r.text);
    t.equal(r.body.error.code, 'rate_limited');
    t.match(r.body.error.message, /storage_gb 0 of 0 used, 1 more asked/, 'refused at the start, for the base');
    t.same(r.body.error.details, [{ field: 'config.storage_gb', issue: "over the project's quota of 0" }]);
    t.ok(Number(r.headers.get('retry-after')) > 0, 'Retry-After');
    t.equal((await call('GET', '/v1/bases/bbfull-x')).status, 404, 'no base');
    // Control: with room it starts (a GB for the base, and the temporary box's 2 GB: it is a
    // box of the project while the script runs).
    t.equal((await call('PUT', '/v1/projects/bbfull', { quotas: { storage_gb: 3 } })).status, 200);
    const ok = await call('POST', '/v1/base-builds', { base: 'bbfull-x', parent: 'busybox', script: 'true', project: 'bbfull' });
    t.equal(ok.status, 202, ok.text);
    t.equal((await waitOp(ok)).status, 'succeeded');
    t.equal((await call('DELETE', '/v1/bases/bbfull-x')).status, 204);
  });

  const script = 'echo built > /etc/built\necho first line\nsleep 1\necho second line >&2\n';
  let buildId = '';

  t.test('a build: queued, its log streamed, then succeeded; the temporary box gone; the base seeds boxes', async (t) => {
    const r = await call('POST', '/v1/base-builds', { base: 'tools', parent: 'busybox', script });
    t.equal(r.status, 202, r.text);
    t.same(Object.keys(r.body).sort(), ['cached', 'id', 'status', 'version']);
    t.match(r.body, { status: 'queued', version: versionOf(script), cached: false });
    buildId = r.body.id;
    t.equal(r.headers.get('location'), `/v1/base-builds/${buildId}`);
    const followed = await fetch(`${host.url}/v1/base-builds/${buildId}/logs?follow=true`, { headers: { authorization: `Bearer ${host.adminToken}` } });
    t.equal(followed.status, 200);
    const text = await followed.text();
    t.equal(text, 'first line\nsecond line\n', 'the follow ends with the build, every line in it');
    t.equal((await waitOp(r)).status, 'succeeded');
    const b = (await call('GET', `/v1/base-builds/${buildId}`)).body;
    t.match(b, { id: buildId, status: 'succeeded', base: 'tools', version: versionOf(script), parent: `busybox@${busybox}`, cached: false, error: null, exit_code: 0, box: null });
    t.same(await buildBoxes(), [], 'the temporary box is gone');
    const base = (await call('GET', `/v1/bases/tools@${versionOf(script)}`)).body;
    t.match(base, { name: 'tools', origin: 'built', parent_alias: 'busybox', parent_version: busybox, script });
    const made = await call('POST', '/v1/projects/bb/boxes?wait=120', { name: 'u', base: 'tools' });
    t.equal(made.body.status, 'running', made.text);
    t.equal((await call('POST', '/v1/projects/bb/boxes/u/exec', { command: ['cat', '/etc/built'] })).body.stdout, 'built\n');
    t.equal((await call('GET', `/v1/base-builds/${buildId}/logs`)).text, 'first line\nsecond line\n');
  });

  t.test('the same inputs are cached; force is refused while a box uses it, then rebuilds', async (t) => {
    const again = await call('POST', '/v1/base-builds', { base: 'tools', parent: 'busybox', script });
    t.equal(again.status, 202);
    t.match(again.body, { status: 'succeeded', cached: true, version: versionOf(script) });
    t.ok(again.headers.get('operation-id'), 'with its (finished) operation');
    t.equal((await call('GET', `/v1/operations/${again.headers.get('operation-id')}`)).body.status, 'succeeded');
    t.match((await call('GET', `/v1/base-builds/${again.body.id}`)).body, { status: 'succeeded', cached: true });
    const waited = await call('POST', '/v1/base-builds?wait=30', { base: 'tools', parent: 'busybox', script });
    t.equal(waited.status, 200, `?wait answers the finished build (DESIGN.md §3): ${waited.text}`);
    t.match(waited.body, { status: 'succeeded', cached: true, base: 'tools', version: versionOf(script), parent: `busybox@${busybox}` });
    t.equal(waited.headers.get('location'), `/v1/base-builds/${waited.body.id}`);
    for (const q of ['wait=abc', 'wait=301', 'bogus=1']) t.equal((await call('POST', `/v1/base-builds?${q}`, { base: 'tools', parent: 'busybox', script })).status, 400, `?${q} → 400`);
    const pinned = await call('POST', '/v1/base-builds', { base: 'tools', parent: `busybox@${busybox}`, script });
    t.match(pinned.body, { cached: true, version: versionOf(script) }, 'a pinned parent gives the same version');

    const busy = await call('POST', '/v1/base-builds', { base: 'tools', parent: 'busybox', script, force: true });
    t.equal(busy.status, 409, 'a box uses the version');
    t.equal((await waitOp(await call('DELETE', '/v1/projects/bb/boxes/u'))).status, 'succeeded');
    const forced = await call('POST', '/v1/base-builds', { base: 'tools', parent: 'busybox', script, force: true });
    t.match(forced.body, { status: 'queued', cached: false, version: versionOf(script) });
    t.equal((await waitOp(forced)).status, 'succeeded');
    t.match((await call('GET', `/v1/base-builds/${forced.body.id}`)).body, { status: 'succeeded', cached: false });
    const made = await call('POST', '/v1/projects/bb/boxes?wait=120', { name: 'u2', base: `tools@${versionOf(script)}` });
    t.equal((await call('POST', '/v1/projects/bb/boxes/u2/exec', { command: ['cat', '/etc/built'] })).body.stdout, 'built\n', made.text.slice(0, 100));
    t.equal((await waitOp(await call('DELETE', '/v1/projects/bb/boxes/u2'))).status, 'succeeded');
  });

  t.test('a failing script: failed with its exit code, no temporary box, no base', async (t) => {
    const bad = 'echo going wrong; exit 3';
    const r = await call('POST', '/v1/base-builds?wait=180', { base: 'broken', parent: 'busybox', script: bad });
    t.equal(r.status, 200, `?wait: the build ended in time, failed: ${r.text}`);
    t.match(r.body, { status: 'failed', exit_code: 3, base: 'broken' });
    t.equal((await call('GET', `/v1/operations/${r.headers.get('operation-id')}`)).body.status, 'failed');
    const b = (await call('GET', `/v1/base-builds/${r.body.id}`)).body;
    t.match(b, { status: 'failed', exit_code: 3 });
    t.match(b.error, /exited 3/);
    t.equal((await call('GET', `/v1/base-builds/${r.body.id}/logs`)).text, 'going wrong\n');
    t.same(await buildBoxes(), [], 'no temporary box is left');
    t.equal((await call('GET', '/v1/bases/broken')).status, 404, 'no base was made');
  });

  t.test('another project cannot see a build', async (t) => {
    const other = (await call('POST', '/v1/tokens', { name: 'other-build', projects: ['other'] })).body.token;
    t.equal((await host.call('GET', `/v1/base-builds/${buildId}`, { token: other })).status, 404);
    t.equal((await host.call('GET', `/v1/base-builds/${buildId}/logs`, { token: other })).status, 404);
    const elsewhere = await host.call('POST', '/v1/base-builds', { token: other, body: { base: 'sneaky', parent: 'busybox', script: 'true', project: 'bb' } });
    t.equal(elsewhere.status, 404, `nor is one started in a project this token does not reach: ${elsewhere.text}`);
    t.equal(elsewhere.body.error.message, 'project bb not found');
  });

  t.test('the CLI: box build start -f, status, logs; box base build', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_PROJECT: 'bb', XDG_CONFIG_HOME: host.config.dataDir };
    const box = (...args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [MAIN, ...args], { env }, (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }));
      });
    const r = await box('--json', 'build', 'start', 'clitools', '--parent', 'busybox', '--script', 'echo from-cli', '-f');
    t.equal(r.code, 0, r.stderr);
    t.match(r.stderr, /from-cli/, 'the log as it ran');
    const b = JSON.parse(r.stdout);
    t.match(b, { status: 'succeeded', base: 'clitools', project: 'bb' }, 'without -p, the build is $BOXHOST_PROJECT\'s');
    t.match((await box('build', 'status', b.id)).stdout, /status:\s+succeeded/);
    t.equal((await box('build', 'logs', b.id)).stdout, 'from-cli\n');
    const cached = await box('base', 'build', 'clitools', '--parent', 'busybox', '--script', 'echo from-cli');
    t.match(cached.stdout, /exists already \(cached/);
    const fail = await box('build', 'start', 'clibroken', '--parent', 'busybox', '--script', 'exit 7', '--wait');
    t.equal(fail.code, 1);
    t.match(fail.stderr, /exited 7/);
    t.equal((await box('build', 'start', 'x', '--parent', 'busybox')).code, 2, 'no script: a usage error');
    // --global: a base of every project, $BOXHOST_PROJECT notwithstanding.
    const g = await box('--json', 'build', 'start', 'gtools', '--parent', 'busybox', '--script', 'true', '--global', '--wait');
    t.equal(g.code, 0, g.stderr);
    const gb = await call('GET', '/v1/bases/gtools');
    t.equal(gb.status, 200, gb.text);
    t.equal(gb.body.project, null, 'the base is every project\'s');
    t.equal((await box('build', 'start', 'x', '--parent', 'busybox', '--script', 'true', '--global', '-p', 'bb')).code, 2, '-p and --global: a usage error');
  });
});
