import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import t, { Test } from 'tap';
import { startTestHost } from './helpers/host';
import { testJobs } from './fixtures/testJobs';
import { BOX_MAIN, BoxRun, boxEnv, runBox } from './helpers/cli';

const MAIN = BOX_MAIN;
type Run = BoxRun;
/** Runs `box ARGS` with an environment of its own: nothing of the caller's BOXHOST_* leaks in. */
const box = (args: string[], env: Record<string, string | undefined>): Promise<Run> => runBox(args, env);

const json = (r: Run) => {
  try {
    return JSON.parse(r.stdout);
  } catch {
    throw new Error(`not JSON (exit ${r.code}): ${r.stdout}\nstderr: ${r.stderr}`);
  }
};

t.test('box CLI against a real host', async (t) => {
  const host = await startTestHost(t, {}, { extraJobs: testJobs });
  const cfgDir = fs.mkdtempSync(path.join(os.tmpdir(), 'box-cli-'));
  t.teardown(() => fs.rmSync(cfgDir, { recursive: true, force: true }));
  const configFile = path.join(cfgDir, 'config.json');
  const env = { BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, BOXHOST_CONFIG: configFile };
  const run = (...args: string[]) => box(args, env);
  /** Exit 0 (asserted on the subtest `t`), with the failure's output in the message when it is not. */
  const ok = async (t: Test, ...args: string[]) => {
    const r = await run(...args);
    t.equal(r.code, 0, `box ${args.join(' ')} → exit 0 (stderr: ${r.stderr.trim()})`);
    return r;
  };

  t.test('version', async (t) => {
    const human = await ok(t, 'version');
    t.match(human.stdout, /^client:\s+0\.1\.0$/m);
    t.match(human.stdout, /^server:\s+0\.1\.0$/m);
    t.match(human.stdout, /^api:\s+v1$/m);
    const r = await ok(t, 'version', '--json');
    t.match(json(r), { api_version: 'v1', version: '0.1.0', commit: String });
    t.same(json(await ok(t, '--json', 'version')), json(r), '--json before or after the command');
  });

  t.test('openapi', async (t) => {
    const human = await ok(t, 'openapi');
    t.match(human.stdout, /^POST\s+\/v1\/projects\/\{project\}\/boxes\s+Create a box/m);
    t.equal(json(await ok(t, 'openapi', '--json')).openapi, '3.1.0');
  });

  t.test('health --json', async (t) => {
    const r = await run('health', '--json');
    const body = json(r);
    t.match(body, { status: /^(ok|degraded)$/, checks: { db: 'ok', redis: 'ok' } });
    t.equal(r.code, body.status === 'ok' ? 0 : 1, 'exit 1 exactly when degraded (503)');
    t.equal(body.status, 'ok', JSON.stringify(body.checks));
    t.match((await run('health')).stdout, /^status: ok$/m);
  });

  t.test('token create, ls, rm; the new token works as --token', async (t) => {
    const human = await ok(t, 'token', 'create', 'cli-human', '--expires-in', '3600');
    const secret = /^\s+(\S+)\s*$/m.exec(human.stdout.split('shown only this once')[1])?.[1];
    t.ok(secret, 'the secret is printed on a line of its own');
    t.equal(human.stdout.split(secret!).length, 2, 'printed once');
    t.match(human.stdout, /created token cli-human \(id tok_\w+/);

    const created = json(await ok(t, 'token', 'create', 'cli-ci', '--project', 'alpha', '--project', 'beta', '--json'));
    t.match(created, { name: 'cli-ci', projects: ['alpha', 'beta'], expires_at: null, token: String });

    const admin = json(await ok(t, 'token', 'create', 'cli-admin', '--json'));
    const ls = await ok(t, 'token', 'ls');
    t.match(ls.stdout, /^ID\s+NAME\s+PROJECTS\s+CREATED\s+EXPIRES\s+LAST USED$/m);
    t.match(ls.stdout, new RegExp(`^${created.id}\\s+cli-ci\\s+alpha,beta\\s`, 'm'));
    t.notMatch(ls.stdout, created.token, 'never the secret');
    const listed = json(await ok(t, 'token', 'ls', '--json'));
    t.same(listed.tokens.map((x: any) => x.name).sort(), ['cli-admin', 'cli-ci', 'cli-human']);

    // --token wins over BOXHOST_TOKEN (which is wrong here).
    const withFlag = await box(['--token', admin.token, 'grant', 'ls'], { ...env, BOXHOST_TOKEN: 'bxh_wrong' });
    t.equal(withFlag.code, 0, withFlag.stderr);
    const limited = await run('--token', created.token, 'grant', 'ls');
    t.equal(limited.code, 1, 'a project-limited token may not list grants');
    t.match(limited.stderr, /^error: .*limited to projects/m);

    const rm = await ok(t, 'token', 'rm', admin.id);
    t.match(rm.stdout, `revoked token ${admin.id}`);
    const revoked = await run('--token', admin.token, 'grant', 'ls');
    t.equal(revoked.code, 1);
    t.match(revoked.stderr, /^error: the bearer token is unknown, revoked or expired$/m);
    t.equal((await run('token', 'rm', admin.id)).code, 1, 'gone');
  });

  t.test('auth settings get / set', async (t) => {
    const got = await ok(t, 'auth', 'settings', 'get');
    t.match(got.stdout, /^configured:\s+false$/m);
    t.match(got.stdout, /^allowed domains:\s+-$/m);
    const before = json(await ok(t, 'auth', 'settings', 'get', '--json'));
    t.same(before.settings, { allow_all_idp_accounts: false, allowed_domains: [], allowed_emails: [], protect_system_domains: false });

    const set = json(await ok(t, 'auth', 'settings', 'set', '--allowed-domain', 'example.com', '--allowed-domain', 'corp.example', '--protect-system-domains', 'true', '--json'));
    t.same(set.settings, { allow_all_idp_accounts: false, allowed_domains: ['example.com', 'corp.example'], allowed_emails: [], protect_system_domains: true });

    // Only the flags given are sent: the domains stay.
    const more = await ok(t, 'auth', 'settings', 'set', '--allow-all-idp-accounts', 'true', '--allowed-email', 'Ann@Example.com');
    t.match(more.stdout, /^allow all idp accounts:\s+true$/m);
    t.match(more.stdout, /^allowed domains:\s+example\.com,corp\.example$/m);
    t.match(more.stdout, /^allowed emails:\s+ann@example\.com$/m);

    const cleared = json(await ok(t, 'auth', 'settings', 'set', '--clear-allowed-domains', '--json'));
    t.same(cleared.settings.allowed_domains, []);
    t.equal(cleared.settings.allow_all_idp_accounts, true);

    const nothing = await run('auth', 'settings', 'set');
    t.equal(nothing.code, 2, 'nothing to set is a usage error');
    t.match(nothing.stderr, /nothing to set/);
    t.equal((await run('auth', 'settings', 'set', '--protect-system-domains', 'maybe')).code, 2);

    const bad = await run('auth', 'settings', 'set', '--allowed-email', 'not-an-email');
    t.equal(bad.code, 1);
    t.match(bad.stderr, /^error: invalid body/m);
    t.match(bad.stderr, /^ {2}allowed_emails\.0: must be a valid email$/m, 'each detail on its own line');
  });

  t.test('grant create / ls / get / update / rm', async (t) => {
    const created = await ok(t, 'grant', 'create', 'deploy-bot', '--permission', 'contents=read', '--permission', 'issues=write', '--repo', 'acme/web', '--repo', 'acme/api');
    t.match(created.stdout, /^name:\s+deploy-bot$/m);
    t.match(created.stdout, /^permissions:\s+contents=read,issues=write$/m);
    t.match(created.stdout, /^repositories:\s+acme\/web,acme\/api$/m);

    const dup = await run('grant', 'create', 'deploy-bot', '--permission', 'contents=read', '--repo', 'acme/web');
    t.equal(dup.code, 1);
    t.match(dup.stderr, /^error: /m);

    const ls = await ok(t, 'grant', 'ls');
    t.match(ls.stdout, /^NAME\s+PERMISSIONS\s+REPOSITORIES\s+UPDATED$/m);
    t.match(ls.stdout, /^deploy-bot\s+contents=read,issues=write\s+acme\/web,acme\/api\s/m);

    t.match(json(await ok(t, 'grant', 'get', 'deploy-bot', '--json')), {
      name: 'deploy-bot',
      permissions: { contents: 'read', issues: 'write' },
      repositories: ['acme/web', 'acme/api'],
    });

    const updated = json(await ok(t, 'grant', 'update', 'deploy-bot', '--repo', 'acme/docs', '--json'));
    t.same(updated.repositories, ['acme/docs'], '--repo replaces the list');
    t.same(updated.permissions, { contents: 'read', issues: 'write' }, 'permissions untouched');
    t.equal((await run('grant', 'update', 'deploy-bot')).code, 2, 'nothing to update');

    const invalid = await run('grant', 'create', 'x', '--permission', 'contents=admin', '--repo', 'acme/web');
    t.equal(invalid.code, 1);
    t.match(invalid.stderr, /^ {2}permissions\.contents: /m);
    t.equal((await run('grant', 'create', 'x', '--repo', 'acme/web')).code, 2, '--permission is required');
    t.equal((await run('grant', 'create', 'x', '--permission', 'contents', '--repo', 'a/b')).code, 2, 'NAME=LEVEL');

    t.match((await ok(t, 'grant', 'rm', 'deploy-bot')).stdout, 'deleted grant deploy-bot');
    t.match((await ok(t, 'grant', 'ls')).stdout, /^no grants$/m);
  });

  t.test('a failing call prints the server message and exits 1', async (t) => {
    const r = await run('grant', 'get', 'no-such-grant');
    t.equal(r.code, 1);
    t.equal(r.stdout, '');
    t.equal(r.stderr, 'error: grant no-such-grant not found\n', "the server's message, nothing else");
    // With --json the api's error body is on stdout too, for a script that reads stdout.
    const j = await run('grant', 'get', 'no-such-grant', '--json');
    t.equal(j.code, 1);
    t.same(JSON.parse(j.stdout), { error: { code: 'not_found', message: 'grant no-such-grant not found', details: [] } });
    t.equal(j.stderr, 'error: grant no-such-grant not found\n');
    const noToken = await box(['grant', 'ls'], { BOXHOST_URL: host.url, BOXHOST_CONFIG: configFile });
    t.equal(noToken.code, 1);
    t.match(noToken.stderr, /^error: a valid bearer token is required$/m);
    t.match(noToken.stderr, /hint: no token is set/);
  });

  t.test('usage errors exit 2', async (t) => {
    for (const args of [['no-such-command'], ['create', 'web', '--cpus', 'many'], ['grant', 'get'], ['ls', '-p', 'a', '--all-projects'], ['exec', 'web', 'ls', '-la'], []]) {
      const r = await run(...args);
      t.equal(r.code, 2, `box ${args.join(' ')}: ${r.stderr.split('\n')[0]}`);
      t.ok(r.stderr.length > 0, 'says why on stderr');
    }
    t.equal((await run('--help')).code, 0);
  });

  t.test('connection failure says where and what to set', async (t) => {
    const r = await box(['version'], { BOXHOST_URL: 'http://127.0.0.1:9', BOXHOST_CONFIG: configFile });
    t.equal(r.code, 1);
    t.match(r.stderr, /^error: cannot reach the boxhost api at http:\/\/127\.0\.0\.1:9 \(BOXHOST_URL\)/m);
    t.match(r.stderr, /BOXHOST_URL/);
    t.match(r.stderr, /box target add/);
  });

  t.test('target add / use / ls, then a call through the target', async (t) => {
    const tenv = { BOXHOST_CONFIG: path.join(cfgDir, 'targets.json') };
    const tb = (...args: string[]) => box(args, tenv);
    t.match((await tb('target', 'ls')).stdout, /no targets yet/);
    const add = await tb('target', 'add', 'local', '--url', host.url, '--token', host.adminToken);
    t.equal(add.code, 0, add.stderr);
    t.match(add.stdout, /\(current\)/, 'the first target becomes current');
    t.equal((await tb('target', 'add', 'down', '--url', 'http://127.0.0.1:9')).code, 0);
    t.equal((await tb('target', 'add', 'nourl')).code, 2, '--url is required');

    const cfg = JSON.parse(fs.readFileSync(tenv.BOXHOST_CONFIG, 'utf8'));
    t.same(cfg, { current: 'local', targets: { local: { url: host.url, token: host.adminToken }, down: { url: 'http://127.0.0.1:9' } } });
    t.equal(fs.statSync(tenv.BOXHOST_CONFIG).mode & 0o777, 0o600, 'the file holding tokens is private');

    const ls = await tb('target', 'ls');
    t.match(ls.stdout, new RegExp(`^\\*\\s+local\\s+${host.url.replace(/\./g, '\\.')}\\s+set$`, 'm'));
    t.match(ls.stdout, /^\s+down\s+http:\/\/127\.0\.0\.1:9\s+none$/m);
    t.notMatch(ls.stdout, host.adminToken);

    const viaTarget = await tb('version', '--json');
    t.equal(viaTarget.code, 0, viaTarget.stderr);
    t.equal((await tb('token', 'ls')).code, 0, 'the target token is used');

    t.equal((await tb('target', 'use', 'down')).code, 0);
    const down = await tb('version');
    t.equal(down.code, 1);
    t.match(down.stderr, /http:\/\/127\.0\.0\.1:9 \(target down\)/);
    t.equal((await tb('--target', 'local', 'token', 'ls')).code, 0, '--target picks another');
    t.equal((await box(['grant', 'ls'], { ...tenv, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken })).code, 0, 'env beats the target');
    t.equal((await tb('--target', 'nope', 'version')).code, 2, 'unknown target');
    t.equal((await tb('target', 'use', 'nope')).code, 2);

    t.equal((await tb('target', 'use', 'local')).code, 0);
    t.match(json(await tb('target', 'ls', '--json')), { current: 'local' });

    // XDG_CONFIG_HOME is honoured when BOXHOST_CONFIG is not set.
    const xdg = path.join(cfgDir, 'xdg');
    t.equal((await box(['target', 'add', 'x', '--url', host.url], { XDG_CONFIG_HOME: xdg })).code, 0);
    t.ok(fs.existsSync(path.join(xdg, 'boxhost', 'config.json')));
  });

  t.test('box ls on an empty project', async (t) => {
    const r = await ok(t, 'ls', '-p', 'empty-project');
    t.equal(r.stdout, 'no boxes in project empty-project\n');
    t.same(json(await ok(t, 'ls', '-p', 'empty-project', '--json')), { boxes: [], has_more: false, next_continuation_token: null });
    t.same(json(await box(['ls', '--json'], { ...env, BOXHOST_PROJECT: 'other-empty' })), { boxes: [], has_more: false, next_continuation_token: null });
    const bad = await run('ls', '-p', 'Bad_Name');
    t.equal(bad.code, 1);
    t.match(bad.stderr, /^error: invalid path/m);
  });

  t.test('op get / op wait', async (t) => {
    const enqueue = (kind: string, payload: unknown) =>
      host.db.transaction((trx) => host.api!.queue.enqueue(trx, { kind, payload }, { resource: `/v1/test/${kind}`, node: host.config.nodeId, attempts: 1 }));
    const dir = fs.mkdtempSync(path.join(cfgDir, 'jobs-'));
    const slow = await enqueue('test.slow', { dir, sleepMs: 300, name: 'cli' });
    const done = await ok(t, 'op', 'wait', slow.id, '--timeout', '30');
    t.match(done.stdout, /^status:\s+succeeded$/m);
    t.match(json(await ok(t, 'op', 'get', slow.id, '--json')), { id: slow.id, kind: 'test.slow', status: 'succeeded', progress: 100 });

    const failing = await enqueue('test.fail', { dir });
    const failed = await run('op', 'wait', failing.id, '--timeout', '30');
    t.equal(failed.code, 1, 'a failed operation exits 1');
    t.match(failed.stdout, /^error:\s+this job always fails$/m);
    const missing = await run('op', 'get', 'op_nothere');
    t.equal(missing.code, 1);
    t.match(missing.stderr, /^error: operation op_nothere not found$/m);
  });

  const health = json(await run('health', '--json'));
  const noBoxes = health.status === 'ok' ? false : `the host cannot run boxes here: ${JSON.stringify(health.checks)}`;
  t.test('box lifecycle', { skip: noBoxes }, async (t) => {
    const p = ['-p', 'cli'];
    const created = await run('create', 'web', ...p, '--tag', 'tier=front', '--env', 'GREETING=hello world', '--cpus', '1', '--ram-mb', '256', '--wait');
    t.equal(created.code, 0, created.stderr);
    t.match(created.stdout, 'created box web');
    t.match(created.stderr, 'creating box web…', 'progress on stderr');

    const box1 = json(await ok(t, 'get', 'web', ...p, '--json'));
    t.match(box1, { name: 'web', project: 'cli', status: 'running', tags: { tier: 'front' }, environment: { GREETING: 'hello world' }, config: { cpus: 1, ram_mb: 256 } });
    const ls = await ok(t, 'ls', ...p);
    t.match(ls.stdout, /^NAME\s+PROJECT\s+STATUS\s+BASE\s+ADDRESS\s+CREATED$/m);
    t.match(ls.stdout, /^web\s+cli\s+running\s+busybox@\S+\s+\d+\.\d+\.\d+\.\d+\s/m);
    t.match((await ok(t, 'project', 'ls')).stdout, /^cli\s+1\/1000\s+1\/1000\s+256\/\d+\s+2\/\d+\s/m);
    t.match((await ok(t, 'project', 'get', 'cli')).stdout, /^boxes:\s+1 of 1000$/m);
    const q = await ok(t, 'project', 'quota', 'cli', '--boxes', '1', '--ram-mb', '4096');
    t.match(q.stdout, /^boxes:\s+1 of 1$/m);
    t.match(q.stdout, /^ram mb:\s+256 of 4096$/m);
    const over = await run('create', 'web-too', ...p);
    t.equal(over.code, 1, 'over the quota');
    t.match(over.stderr, /^error: project cli is at its quota: boxes 1 of 1 used/m);
    t.match(json(await ok(t, 'project', 'quota', 'cli', '--reset', 'boxes', '--reset', 'ram_mb', '--json')), { quotas: { boxes: 1000, ram_mb: 1024 * 1024 } });
    t.equal((await run('project', 'quota', 'cli', '--reset', 'disks')).code, 2, 'an unknown quota is a usage error');

    const ex = await run('exec', 'web', ...p, '--', 'sh', '-c', 'echo "$GREETING"; echo to-err >&2; exit 7');
    t.equal(ex.code, 7, 'the command exit code');
    t.equal(ex.stdout, 'hello world\n');
    t.equal(ex.stderr, 'to-err\n');
    const sh = await run('exec', 'web', ...p, '--shell', '--env', 'X=1', '--cwd', '/tmp', '--', 'echo $X; pwd');
    t.equal(sh.code, 0, sh.stderr);
    t.equal(sh.stdout, '1\n/tmp\n');
    t.match(json(await run('exec', 'web', ...p, '--json', '--', 'true')), { exit_code: 0, detached: false });
    const slow = await run('exec', 'web', ...p, '--timeout', '1', '--', 'sh', '-c', 'echo started; sleep 5');
    t.equal(slow.code, 124);
    t.equal(slow.stdout, 'started\n');
    t.match(slow.stderr, /^box: the command was stopped after its timeout of 1 s \(--timeout to change it\)$/m, 'a timeout says so');
    const badPort = await run('publish', 'web', 'abc', ...p);
    t.equal(badPort.code, 2, 'a bad port is a usage error');
    t.match(badPort.stderr, /^error: port "abc" must be an integer/m, 'and says so (it printed nothing)');
    const noPublish = await run('open', 'web', 'zz', ...p);
    t.equal(noPublish.code, 1, 'a publish that is not there is not a usage error');
    t.match(noPublish.stderr, /^error: box web publishes nothing/m);
    // A terminal without -i gets no input, and no end of it either (an end on a terminal is a
    // typed ^D, which would end cat at once): cat waits until the timeout.
    const tty = await run('exec', 'web', ...p, '-t', '--timeout', '2', '--', 'cat');
    t.equal(tty.code, 124, `no ^D typed into the terminal (${tty.stderr.trim()})`);
    const own = await run('exec', 'web', ...p, '--', 'sh', '-c', 'exit 124');
    t.equal(own.code, 124);
    t.equal(own.stderr, '', "the command's own 124 is not called a timeout");
    // The output streams as it comes: the command waits for a mark the test makes only once it
    // has seen the first line (held back to the end, the command would run into its timeout).
    const streamed = await new Promise<{ code: number | null; out: string }>((resolve, reject) => {
      const child = spawn(process.execPath, [MAIN, 'exec', 'web', ...p, '--timeout', '30', '--', 'sh', '-c', 'rm -f /tmp/go; echo first; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo second'], { env: boxEnv(env) });
      let out = '';
      let marked = false;
      child.stdout.on('data', (b: Buffer) => {
        out += b;
        if (!marked && out.includes('first\n')) {
          marked = true;
          void host.call('POST', '/v1/projects/cli/boxes/web/exec', { body: { command: ['touch', '/tmp/go'] } }).catch(reject);
        }
      });
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, out }));
    });
    t.same(streamed, { code: 0, out: 'first\nsecond\n' }, 'the first line came while the command ran');
    // Byte for byte: 3 MB of random bytes, and a slow reader (a pipe read later) loses none.
    const made = await run('exec', 'web', ...p, '--', 'sh', '-c', 'head -c 3000000 /dev/urandom > /tmp/r && sha256sum /tmp/r');
    const bytes = await new Promise<Buffer>((resolve, reject) => {
      const child = spawn(process.execPath, [MAIN, 'exec', 'web', ...p, '--', 'cat', '/tmp/r'], { env: boxEnv(env) });
      const chunks: Buffer[] = [];
      child.stdout.pause();
      setTimeout(() => child.stdout.on('data', (b: Buffer) => chunks.push(b)).resume(), 1500);
      child.on('error', reject);
      child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(chunks)) : reject(new Error(`exit ${code}`))));
    });
    t.equal(bytes.length, 3000000);
    t.equal(crypto.createHash('sha256').update(bytes).digest('hex'), made.stdout.split(' ')[0], 'the same bytes as in the box');

    const upd = json(await ok(t, 'update', 'web', ...p, '--tag', 'tier=back', '--tag', 'team=a', '--grace-period', '5', '--json'));
    t.same(upd.tags, { tier: 'back', team: 'a' });
    t.equal(upd.termination_grace_period_seconds, 5);
    t.same(json(await ok(t, 'update', 'web', ...p, '--clear-tags', '--json')).tags, {}, 'tags replace the whole map');

    const fork = await run('fork', 'web', 'web2', ...p, '--wait');
    t.equal(fork.code, 0, fork.stderr);
    const page = await ok(t, 'ls', ...p, '--max-results', '1');
    t.match(page.stderr, /more boxes: add --continuation-token \S+/);
    const token = /--continuation-token (\S+)/.exec(page.stderr)![1];
    t.match((await ok(t, 'ls', ...p, '--max-results', '1', '--continuation-token', token)).stdout, /^web2\s/m);
    t.match((await ok(t, 'ls', '--all-projects', '--prefix', 'web')).stdout, /^web2?\s+cli\s/m);

    // Without --wait: the box in its transitional state and the operation to follow.
    const stop = await ok(t, 'stop', 'web', ...p);
    t.match(stop.stdout, /^status:\s+stopping$/m);
    const opId = /^operation: (op_\w+)/m.exec(stop.stdout)![1];
    t.match((await ok(t, 'op', 'wait', opId, '--timeout', '60')).stdout, /^status:\s+succeeded$/m);
    t.match(json(await ok(t, 'get', 'web', ...p, '--json')), { status: 'stopped' });
    const again = await run('stop', 'web', ...p);
    t.equal(again.code, 1, 'stopping a stopped box is a conflict');
    t.match(again.stderr, /^error: /m);

    const resumed = json(await ok(t, 'resume', 'web', ...p, '--wait', '--json'));
    t.match(resumed, { kind: String, status: 'succeeded' }, '--wait --json prints the finished operation');
    t.match(json(await ok(t, 'get', 'web', ...p, '--json')), { status: 'running' });
    // The box's operations, newest first: resume, stop, create (the fork's is web2's).
    const ops = json(await ok(t, 'op', 'ls', '--box', 'web', ...p, '--json'));
    t.same(ops.operations.map((o: { kind: string }) => o.kind), ['box.resume', 'box.stop', 'box.create']);
    t.equal(ops.operations[1].id, opId);
    const opTable = await ok(t, 'op', 'ls', '--box', 'web', ...p);
    t.match(opTable.stdout, /^ID\s+KIND\s+STATUS\s+PROGRESS\s+RESOURCE\s+CREATED\s+ERROR$/m);
    t.match(opTable.stdout, new RegExp(`^${opId}\\s+box\\.stop\\s+succeeded\\s+100%\\s+/v1/projects/cli/boxes/web\\s`, 'm'));
    t.equal((await ok(t, 'op', 'ls', ...p, '--pending')).stdout, 'no operations\n', 'nothing left to happen');
    t.equal((await run('op', 'ls', '--pending', '--status', 'failed')).code, 2, 'both is a usage error');

    t.equal((await run('rm', 'web2', ...p, '--wait')).code, 0);
    t.equal((await run('rm', 'web', ...p, '--wait')).code, 0);
    const gone = await run('get', 'web', ...p);
    t.equal(gone.code, 1);
    t.match(gone.stderr, /^error: box cli\/web not found$/m);
  });

  t.test('node ls / get / drain / undrain / rm', { skip: noBoxes }, async (t) => {
    const p = ['-p', 'cli-nodes'];
    const ls = await ok(t, 'node', 'ls');
    t.match(ls.stdout, /^ID\s+REGION\s+STATE\s+STATUS\s+BOXES\s+CPUS\s+RAM\s+DISK\s+HEARTBEAT$/m);
    t.match(ls.stdout, /^local\s+local\s+active\s+up\s+\d+\s+\d+\/\d+\s+[\d.]+ GiB\/[\d.]+ GiB\s+\d+\/\d+ GB\s/m, 'storage promised of what may be');
    const node = json(await ok(t, 'node', 'get', 'local', '--json'));
    t.match(node, { id: 'local', region: 'local', state: 'active', status: 'up', reason: null, storage: 'ok', capacity: { cpus: Number, ram_mb: Number, disk_gb: Number } });
    t.ok(Date.now() - Date.parse(node.heartbeat_at) < 30_000, 'a fresh heartbeat');

    t.match((await ok(t, 'node', 'drain', 'local')).stdout, /node local is draining/);
    const refused = await run('create', 'nope', ...p, '--wait');
    t.equal(refused.code, 1, 'no node takes a box while the only one drains');
    t.match(refused.stderr, /^error: no node of region local can take a box now: node local is draining$/m);
    const viaHttp = await host.call('POST', '/v1/projects/cli-nodes/boxes', { body: { name: 'nope' } });
    t.equal(viaHttp.status, 503);
    t.equal(viaHttp.body.error.code, 'unavailable');
    t.equal(await host.db('boxes').where({ project: 'cli-nodes' }).count({ n: '*' }).then((r: any) => Number(r[0].n)), 0, 'nothing was made');
    t.match((await ok(t, 'node', 'undrain', 'local')).stdout, /node local is active/);
    const made = await run('create', 'yes', ...p, '--wait');
    t.equal(made.code, 0, made.stderr);
    t.match(json(await ok(t, 'get', 'yes', ...p, '--json')), { node: 'local', status: 'running' });

    const rm = await run('node', 'rm', 'local');
    t.equal(rm.code, 1);
    t.match(rm.stderr, /^error: node local is up; stop its process first/m, 'a node that is up is not forgotten');
    t.equal((await host.call('DELETE', '/v1/nodes/local')).status, 409);
    t.equal((await host.call('GET', '/v1/nodes/nowhere')).status, 404);
    t.equal((await host.call('PUT', '/v1/nodes/local', { body: { state: 'gone' } })).status, 400);
    const tok = (await host.call('POST', '/v1/tokens', { body: { name: 'limited', projects: ['cli-nodes'] } })).body.token;
    t.equal((await host.call('GET', '/v1/nodes', { token: tok })).status, 403, 'nodes are for unlimited tokens');
    t.equal((await run('rm', 'yes', ...p, '--wait')).code, 0);

    // A machine that died an hour ago, with a box on it: forgotten only with --force; its box
    // then reads failed, and deleting it removes the row at once.
    const at = new Date(Date.now() - 3600_000).toISOString();
    await host.db('nodes').insert({ id: 'ghost', name: 'ghost', region: 'local', agent_url: null, state: 'active', cpus: 1, ram_mb: 1024, disk_gb: 1, version: '0.1.0', started_at: at, heartbeat_at: at, storage: 'ok', created_at: at, updated_at: at });
    await host.db('projects').insert({ name: 'cli-ghost', net_index: 200, created_at: at }).onConflict('name').ignore();
    await host.db('boxes').insert({ id: 'bghostbox0000001', project: 'cli-ghost', name: 'orphan', status: 'running', error: null, base: null, fork: null, config: JSON.stringify({ cpus: 1, ram_mb: 64, storage_gb: 1, region: 'local' }), environment: null, tags: null, data_mounts: null, lifecycle: null, pack: null, pack_rev: null, rollback_to: null, termination_grace_period_seconds: 10, url_settings: null, node: 'ghost', address: null, created_at: at, updated_at: at });
    t.match((await ok(t, 'node', 'ls')).stdout, /^ghost\s+local\s+active\s+down\s+1\s/m);
    t.match(json(await ok(t, 'get', 'orphan', '-p', 'cli-ghost', '--json')), { status: 'unknown', error: /node ghost is not answering/ });
    const held = await run('node', 'rm', 'ghost');
    t.equal(held.code, 1);
    t.match(held.stderr, /^error: node ghost still holds 1 boxes/m, 'a down node with boxes needs --force');
    t.equal((await run('rm', 'orphan', '-p', 'cli-ghost')).code, 1, 'its box cannot be deleted while the node may come back (503)');
    t.match((await ok(t, 'node', 'rm', 'ghost', '--force')).stdout, /^forgot node ghost; its boxes are failed and can be deleted$/m);
    t.equal((await host.call('GET', '/v1/nodes/ghost')).status, 404);
    t.match(json(await ok(t, 'get', 'orphan', '-p', 'cli-ghost', '--json')), { status: 'failed', error: 'node ghost was removed while down: this box is lost; delete it' });
    const del = await host.call('DELETE', '/v1/projects/cli-ghost/boxes/orphan?wait=10');
    t.equal(del.status, 204, 'the lost box is deleted at once');
    t.match((await host.call('GET', `/v1/operations/${del.headers.get('operation-id')}`)).body, { kind: 'box.delete', status: 'succeeded' });
    t.equal((await host.call('GET', '/v1/projects/cli-ghost/boxes/orphan')).status, 404);
  });
});
