import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { execFile } from 'node:child_process';
import t from 'tap';
import WebSocket from 'ws';
import pino from 'pino';
import { startHost } from '../server/host';
import { request, startTestHost } from './helpers/host';

/**
 * Services and publishing on a real box (docs/services.md): a start's rules and rejections, a
 * ready gate that passes (busybox httpd) and one that fails, secret redaction, a corrupt spec's
 * tombstone, logs, the publish proxy (HTTP with and without a token, a WebSocket, 502, 503 while
 * stopped, gone with the box), and `commands.start` run as it is.
 */

const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');

/** A request through the proxy with the given Host header. */
function viaProxy(proxyUrl: string, host: string, opts: { path?: string; token?: string; headers?: Record<string, string> } = {}): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }> {
  const u = new URL(proxyUrl);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: opts.path ?? '/', headers: { host, ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}), ...(opts.headers ?? {}) } }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on('error', reject);
    req.end();
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('services and the publish proxy on a real box', async (t) => {
  // An auth provider "configured" (never contacted here): non-public publishes need a token.
  const host = await startTestHost(t, { BOXHOST_OIDC_ISSUER: 'http://127.0.0.1:9/', BOXHOST_OIDC_CLIENT_ID: 'boxhost', BOXHOST_OIDC_CLIENT_SECRET: 'x' });
  const proxyUrl = host.proxyUrl!;
  const P = '/v1/projects/svc/boxes';
  const created = await host.call('POST', `${P}?wait=120`, { body: { name: 'web' } });
  t.equal(created.body.status, 'running', JSON.stringify(created.body));
  const sh = async (script: string) => (await host.call('POST', `${P}/web/exec`, { body: { command: ['sh', '-c', script] } })).body;
  // A page, a CGI that shows what the service was sent, and a one-message WebSocket server.
  await sh(`mkdir -p /srv/www/cgi-bin && echo hello-from-box > /srv/www/index.html
printf '#!/bin/sh\\nprintf "Content-Type: text/plain\\\\r\\\\n\\\\r\\\\n"\\necho "xff=$HTTP_X_FORWARDED_FOR auth=$HTTP_AUTHORIZATION host=$HTTP_HOST"\\n' > /srv/www/cgi-bin/env && chmod +x /srv/www/cgi-bin/env
cat > /srv/ws.sh <<'EOF'
#!/bin/sh
key=
while read -r line; do
  line=$(printf '%s' "$line" | tr -d '\\r')
  [ -z "$line" ] && break
  case "$line" in Sec-WebSocket-Key:*|sec-websocket-key:*) key=$(printf '%s' "\${line#*:}" | tr -d ' ');; esac
done
accept=$(printf '%s' "\${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11" | sha1sum | cut -d' ' -f1 | sed 's/../\\\\x&/g')
accept=$(printf "$accept" | base64)
printf 'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: %s\\r\\n\\r\\n' "$accept"
printf '\\201\\005hello'
cat > /dev/null
EOF
chmod +x /srv/ws.sh`);

  t.test('start: a ready gate that passes, secrets redacted, a private publish', async (t) => {
    const r = await host.call('POST', `${P}/web/services`, {
      body: {
        name: 'www', command: ['httpd', '-f', '-p', '8080', '-h', '/srv/www'], port: 8080, env: { GREETING: 'hi there', API_KEY: 'hunter2-secret' }, secret_env: ['API_KEY'],
        publish: { name: 'site', public: false }, ready: { http: '/', timeout_secs: 20 }, tags: { tier: 'front' }, stop: { signal: 'TERM', grace_secs: 3 },
      },
    });
    t.equal(r.status, 201, JSON.stringify(r.body));
    t.match(r.body, { name: 'www', state: 'running', restart: 'always', restarts: 0, port: 8080, user: 'root', tags: { tier: 'front' }, command: ['httpd', '-f', '-p', '8080', '-h', '/srv/www'] });
    t.ok(r.body.pid > 0, 'a pid in the box');
    t.equal(r.body.url, `http://site--web--svc.localhost:${new URL(proxyUrl).port}`);
    t.notOk('warning' in r.body, 'an auth provider is configured: no fallback warning');
    t.notMatch(r.body.commands.start, /hunter2/, 'the secret value is not in commands.start');
    t.match(r.body.commands.start, / --env API_KEY --env 'GREETING=hi there' --secret-env API_KEY /);
    t.match(r.body.commands.start, /^box svc start web www -p svc .*--port 8080 .*--publish site --private --ready-http \/ --ready-timeout 20 --stop-signal TERM --stop-grace 3 --tag tier=front -- httpd -f -p 8080 -h \/srv\/www$/);
    t.equal(r.body.commands.unpublish, 'box svc unpublish web www -p svc');
    t.equal(r.body.commands.publish, 'box svc publish web www -p svc --name site --private --force');
    const spec = await sh('cat /etc/boxes/services/www.json; stat -c %a /etc/boxes/services/www.json');
    t.match(spec.stdout, /"API_KEY": "hunter2-secret"/, 'the spec in the box keeps the value (the service needs it)');
    t.match(spec.stdout, /\n600\n$/, 'readable by root in the box only');
    const again = await host.call('POST', `${P}/web/services`, { body: { name: 'www', command: ['httpd', '-f', '-p', '8080', '-h', '/srv/www'], port: 8080, publish: { name: 'site', public: false }, ready: { http: '/index.html', status: 200 } } });
    t.equal(again.status, 200, 'replacing a service of the same name: 200');
    t.equal(again.body.state, 'running');
  });

  t.test('the proxy: a token for a private publish, X-Forwarded-*, the token kept from the box', async (t) => {
    const site = `site--web--svc.localhost:${new URL(proxyUrl).port}`;
    const none = await viaProxy(proxyUrl, site);
    t.equal(none.status, 401, 'no token: 401');
    t.equal(JSON.parse(none.body).error.code, 'unauthenticated');
    const ok = await viaProxy(proxyUrl, site, { token: host.adminToken });
    t.equal(ok.status, 200);
    t.equal(ok.body, 'hello-from-box\n', 'busybox httpd in the box answered');
    const cgi = await viaProxy(proxyUrl, site, { token: host.adminToken, path: '/cgi-bin/env' });
    t.equal(cgi.status, 200, cgi.body);
    t.match(cgi.body, /xff=127\.0\.0\.1 auth= host=site--web--svc\.localhost/, 'X-Forwarded-For set; the boxhost token never reaches the box');
    const other = (await host.call('POST', '/v1/tokens', { body: { name: 'elsewhere', projects: ['elsewhere'] } })).body.token;
    t.equal((await viaProxy(proxyUrl, site, { token: other })).status, 404, "a token of another project does not learn the publish exists");
    t.equal((await viaProxy(proxyUrl, `nope--web--svc.localhost`)).status, 404, 'an unknown host: 404');
    t.equal((await viaProxy(proxyUrl, 'example.com')).status, 404, 'a host outside the publish domain: 404');
  });

  t.test('box publishes: default name, 409 without force, 200 with it, in the Box record; 502', async (t) => {
    const a = await host.call('POST', `${P}/web/publish`, { body: { port: 8080 } });
    t.equal(a.status, 201);
    t.match(a.body, { name: 'p8080', port: 8080, public: true, host: 'p8080--web--svc.localhost' });
    t.equal((await viaProxy(proxyUrl, 'p8080--web--svc.localhost')).body, 'hello-from-box\n', 'a public publish needs no token');
    const pubCgi = await viaProxy(proxyUrl, 'p8080--web--svc.localhost', { token: host.adminToken, path: '/cgi-bin/env' });
    t.match(pubCgi.body, /auth= host/, 'a boxhost token is kept from the box on a public publish too');
    const own = await viaProxy(proxyUrl, 'p8080--web--svc.localhost', { token: 'app-own-token', path: '/cgi-bin/env' });
    t.match(own.body, /auth=Bearer app-own-token host/, "the app's own bearer passes through");
    const taken = await host.call('POST', `${P}/web/publish`, { body: { port: 9999, name: 'p8080' } });
    t.equal(taken.status, 409, 'a taken name without force');
    const forced = await host.call('POST', `${P}/web/publish`, { body: { port: 9999, name: 'p8080', force: true } });
    t.equal(forced.status, 200, 'force replaces: 200');
    const gap = await viaProxy(proxyUrl, 'p8080--web--svc.localhost');
    t.equal(gap.status, 502, 'nothing listens on 9999: 502');
    t.match(JSON.parse(gap.body).error.message, /nothing answers on port 9999 in box svc\/web/);
    const box = (await host.call('GET', `${P}/web`)).body;
    t.same(box.publishes.map((p: any) => [p.name, p.port, p.public]).sort(), [['p8080', 9999, true], ['site', 8080, false]], 'the Box record lists its publishes');
    t.same(box.url_settings, { auth: 'bearer' });
    t.equal((await host.call('POST', `${P}/web/services/www/publish`, { body: { name: 'p8080' } })).status, 409, "a service cannot take the box's publish name without force");
    const renamed = await host.call('POST', `${P}/web/services/www/publish`, { body: { name: 'site2', public: false } });
    t.equal(renamed.status, 201, `a service published under a new name: 201, the name is new (DESIGN.md §6): ${renamed.text}`);
    t.same((await host.call('GET', `${P}/web`)).body.publishes.map((p: any) => p.name).sort(), ['p8080', 'site2'], "the service's earlier publish gave way");
    t.equal((await host.call('POST', `${P}/web/services/www/publish`, { body: { name: 'site', public: false } })).status, 201, 'and back');
    t.equal((await host.call('POST', `${P}/web/services/www/publish`, { body: { name: 'site', public: false } })).status, 409, 'its own name again without force: 409');
    t.equal((await host.call('POST', `${P}/web/services/www/publish`, { body: { name: 'site', public: false, force: true } })).status, 200, 'with force: 200, it replaced one');
    t.equal((await host.call('DELETE', `${P}/web/publish/p8080`)).status, 204);
    t.equal((await host.call('DELETE', `${P}/web/publish/p8080`)).status, 404);
    t.equal((await viaProxy(proxyUrl, 'p8080--web--svc.localhost')).status, 404, 'unpublished: 404');

    // A bound: at most 100 publishes a box (the service's `site` is one of them).
    const made: number[] = [];
    for (let i = 1; i < 100; i++) made.push((await host.call('POST', `${P}/web/publish`, { body: { port: 10000 + i } })).status);
    t.same(new Set(made), new Set([201]), '99 more publishes beside the service\'s: 201 each');
    const over = await host.call('POST', `${P}/web/publish`, { body: { port: 20000 } });
    t.equal(over.status, 409, 'the 101st publish of a box: 409');
    t.match(over.body.error.message, /has its most publishes \(100\)/);
    for (let i = 1; i < 100; i++) await host.call('DELETE', `${P}/web/publish/p${10000 + i}`);

    // No auth provider: a private publish falls back to public and says so.
    const config = host.api!.config;
    const oidc = config.oidc;
    config.oidc = {};
    t.teardown(() => void (config.oidc = oidc));
    const open = await host.call('POST', `${P}/web/publish`, { body: { port: 8080, name: 'open', public: false } });
    t.match(open.body, { public: true, warning: /no auth provider is configured/ });
    t.equal((await viaProxy(proxyUrl, open.body.host)).status, 200, 'reached without a token');
    t.equal((await host.call('DELETE', `${P}/web/publish/open`)).status, 204);
    config.oidc = oidc;
  });

  t.test('a WebSocket through the proxy', async (t) => {
    const r = await host.call('POST', `${P}/web/services`, { body: { name: 'ws', command: ['nc', '-ll', '-p', '9000', '-e', '/srv/ws.sh'], port: 9000, publish: { name: 'ws' }, ready: { tcp: 9000, timeout_secs: 10 } } });
    t.equal(r.status, 201, JSON.stringify(r.body));
    const ws = new WebSocket(`ws://127.0.0.1:${new URL(proxyUrl).port}/`, { headers: { host: 'ws--web--svc.localhost' } });
    const message = await new Promise<string>((resolve, reject) => {
      // Cleared once answered: a pending timer keeps the file's process alive past its last test.
      const timer = setTimeout(() => reject(new Error('no message within 10 s')), 10_000);
      ws.on('message', (d: Buffer) => (clearTimeout(timer), resolve(d.toString())));
      ws.on('error', (e) => (clearTimeout(timer), reject(e)));
    });
    t.equal(message, 'hello', 'the handshake and a frame from the box came through');
    ws.terminate();
    // A client that resets its proxied WebSocket, and a request line the proxy cannot forward:
    // answered or dropped, never the process's end.
    const reset = new WebSocket(`ws://127.0.0.1:${new URL(proxyUrl).port}/`, { headers: { host: 'ws--web--svc.localhost' } });
    await new Promise<void>((resolve) => reset.once('message', () => resolve()));
    (reset as unknown as { _socket: net.Socket })._socket.resetAndDestroy();
    const bad = await new Promise<string>((resolve) => {
      const c = net.connect(Number(new URL(proxyUrl).port), '127.0.0.1', () => c.write('GET http://a:99999/ HTTP/1.1\r\nHost: ws--web--svc.localhost\r\n\r\n'));
      let got = '';
      c.on('data', (d) => (got += d));
      c.on('close', () => resolve(got));
      c.on('error', () => resolve(got));
      setTimeout(() => c.destroy(), 3000);
    });
    t.match(bad, /^HTTP\/1\.1 [45]\d\d /, `a request line it cannot forward is answered: ${bad.split('\r\n')[0]}`);
    await sleep(200);
    t.equal((await host.call('GET', '/healthz', { token: null })).status, 200, 'the api (and its proxy) is still up');
  });

  t.test('rejections leave nothing started', async (t) => {
    const bad = async (body: object, field: string, why: string) => {
      const r = await host.call('POST', `${P}/web/services`, { body: { name: 'bad', command: ['sleep', '100'], ...body } });
      t.equal(r.status, 400, `${why}: 400`);
      t.equal(r.body.error?.details?.[0]?.field, field, `${why}: names ${field}`);
    };
    await bad({ env: { A: '1' }, secret_env: ['B'] }, 'secret_env', 'a secret_env that is not a key of env');
    await bad({ publish: { name: 'x' } }, 'publish', 'publish without port');
    await bad({ cwd: '/does/not/exist' }, 'cwd', 'a cwd the box does not have');
    await bad({ user: 'nobody-here' }, 'user', 'an unknown user');
    await bad({ command: ['no-such-program'] }, 'command', 'a command the box cannot find');
    await bad({ ready: { http: '/' } }, 'ready.port', 'an http gate without a port');
    await bad({ restart: 'sometimes' }, 'restart', 'an unknown restart policy');
    await bad({ stop: { signal: 'NOPE' } }, 'stop.signal', 'an unknown signal');
    await bad({ stop: { grace_secs: 301 } }, 'stop.grace_secs', "a grace past the box's own most (300 s)");
    const most = await host.call('POST', `${P}/web/services`, { body: { name: 'patient', command: ['sleep', '100'], stop: { grace_secs: 300 } } });
    t.equal(most.status, 201, 'a grace of exactly 300 s is taken');
    t.equal((await host.call('DELETE', `${P}/web/services/patient`)).status, 204, 'and the service goes at once (sleep ends on TERM)');
    const names = (await host.call('GET', `${P}/web/services`)).body.services.map((s: any) => s.name);
    t.notOk(names.includes('bad'), `nothing was started: ${names}`);
    t.equal((await host.call('GET', `${P}/web/services/bad`)).status, 404);
  });

  t.test('a ready gate that fails: 409 not_ready naming it, the last output lines, listed failed', async (t) => {
    const r = await host.call('POST', `${P}/web/services`, { body: { name: 'slow', command: ['sh', '-c', 'echo warming up; echo still warming >&2; sleep 1000'], ready: { tcp: 7777, timeout_secs: 2 } } });
    t.equal(r.status, 409);
    t.equal(r.body.error.code, 'not_ready');
    t.same(r.body.error.details.map((d: any) => d.field), ['ready.tcp']);
    t.match(r.body.error.message, /warming up[\s\S]*still warming/, 'its output is in the message');
    const st = (await host.call('GET', `${P}/web/services/slow`)).body;
    t.equal(st.state, 'failed');
    t.equal(st.pid, 0, 'it was stopped');
    const early = await host.call('POST', `${P}/web/services`, { body: { name: 'dies', command: ['sh', '-c', 'echo bye; exit 3'], restart: 'never', ready: { tcp: 7778, timeout_secs: 30 } } });
    t.equal(early.status, 409, 'a service that exits for good fails its gate at once');
    t.match(early.body.error.details[0].issue, /the service (exited|failed) with exit code 3/);
  });

  t.test('logs, a corrupt tombstone, stop/start/restart, delete', async (t) => {
    const r = await host.call('POST', `${P}/web/services`, { body: { name: 'ticker', command: ['sh', '-c', 'i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.2; done'] } });
    t.equal(r.status, 201);
    await sleep(700);
    const tail = await host.call('GET', `${P}/web/services/ticker/logs?tail=2`);
    t.equal(tail.status, 200);
    t.equal(tail.text.trim().split('\n').length, 2, 'tail=2: two lines');
    const lastSeen = Math.max(...[...tail.text.matchAll(/tick-(\d+)/g)].map((m) => Number(m[1])));
    // follow with tail=0: only lines that come after the call
    const u = new URL(`${host.url}${P}/web/services/ticker/logs?tail=0&follow=true`);
    const got = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('follow sent nothing for 10 s')), 10_000);
      const req = http.get(u, { headers: { authorization: `Bearer ${host.adminToken}` } }, (res) => {
        let s = '';
        res.on('data', (c) => {
          s += c;
          if (s.split('\n').length > 3) {
            clearTimeout(timer);
            req.destroy();
            resolve(s);
          }
        });
      });
      req.on('error', (e) => (e.message === 'socket hang up' ? undefined : reject(e)));
    });
    const first = Number(/^tick-(\d+)/.exec(got)?.[1]);
    t.ok(first > lastSeen, `follow starts after what tail showed (tick-${first} after tick-${lastSeen})`);
    t.match(got, /^tick-\d+\ntick-\d+\ntick-\d+\n/, 'follow streams new lines');

    await sh('printf "{not json" > /etc/boxes/services/broken.json');
    const list = (await host.call('GET', `${P}/web/services`)).body.services;
    const broken = list.find((s: any) => s.name === 'broken');
    t.match(broken, { state: 'corrupt', error: /not a JSON object/ }, 'a spec that does not load is a tombstone');
    t.ok(list.some((s: any) => s.name === 'www' && s.state === 'running'), 'beside the healthy ones');
    t.equal((await host.call('DELETE', `${P}/web/services/broken`)).status, 204, 'a tombstone can be deleted');

    const tooLong = await host.call('POST', `${P}/web/services/ticker/stop`, { body: { grace_secs: 301 } });
    t.match(tooLong, { status: 400, body: { error: { details: [{ field: 'grace_secs' }] } } }, 'a stop grace past 300 s: 400, the service left running');
    t.equal((await host.call('GET', `${P}/web/services/ticker`)).body.state, 'running');
    const stopped = await host.call('POST', `${P}/web/services/ticker/stop`, { body: { grace_secs: 1 } });
    t.match(stopped.body, { state: 'stopped', pid: 0 });
    const started = await host.call('POST', `${P}/web/services/ticker/start`, { body: {} });
    t.equal(started.body.state, 'running');
    const restarted = await host.call('POST', `${P}/web/services/ticker/restart`, { body: {} });
    t.equal(restarted.status, 200);
    t.ok(restarted.body.pid > 0 && restarted.body.pid !== started.body.pid, 'a new process');
    t.equal((await host.call('DELETE', `${P}/web/services/ticker`)).status, 204);
    t.equal((await host.call('GET', `${P}/web/services/ticker`)).status, 404);
  });

  t.test('commands.start, run as it is, reproduces the service', async (t) => {
    const before = (await host.call('GET', `${P}/web/services/www`)).body;
    // Started once more with a secret, so the line carries --env KEY for it.
    const withSecret = await host.call('POST', `${P}/web/services`, { body: { name: 'www', command: before.command, port: 8080, env: { TOKEN: 's3cret' }, secret_env: ['TOKEN'], publish: { name: 'site', public: false }, ready: { http: '/' } } });
    t.equal(withSecret.status, 200);
    const line = withSecret.body.commands.start;
    t.equal((await host.call('DELETE', `${P}/web/services/www`)).status, 204);
    t.equal((await viaProxy(proxyUrl, 'site--web--svc.localhost', { token: host.adminToken })).status, 404, 'its publish went with it');
    const run = await new Promise<{ code: number; out: string }>((resolve) => {
      const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken, TOKEN: 's3cret', PATH: `${path.dirname(process.execPath)}:${process.env.PATH}` };
      // `box` as the line says it: a shell function for the compiled CLI.
      execFile('sh', ['-c', `box() { "${process.execPath}" "${MAIN}" "$@"; }; ${line}`], { env }, (e, stdout, stderr) => resolve({ code: e ? Number((e as any).code ?? 1) : 0, out: stdout + stderr }));
    });
    t.equal(run.code, 0, run.out);
    const after = (await host.call('GET', `${P}/web/services/www`)).body;
    t.same([after.command, after.port, after.state, after.commands.start], [before.command, 8080, 'running', line], 'the same service, the same line');
    const env = await sh('cat /etc/boxes/services/www.json');
    t.match(env.stdout, /"TOKEN": "s3cret"/, 'the secret came from the environment');
    t.equal((await viaProxy(proxyUrl, 'site--web--svc.localhost', { token: host.adminToken })).body, 'hello-from-box\n', 'published again');
    const cli = (args: string[]) =>
      new Promise<{ code: number; out: string }>((resolve) =>
        execFile(process.execPath, [MAIN, ...args], { env: { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken } }, (e, so, se) => resolve({ code: e ? Number((e as any).code ?? 1) : 0, out: so + se })),
      );
    t.match((await cli(['svc', 'ls', 'web', '-p', 'svc'])).out, /^www\s+running\s+\d+\s+0\s+8080\s+http:\/\/site--web--svc\.localhost:\d+\s+httpd -f/m, 'box svc ls');
    t.equal((await cli(['open', 'web', 'site', '-p', 'svc'])).out.trim(), after.url, 'box open prints the named publish\'s url');
    t.match((await cli(['open', 'web', '-p', 'svc'])).out, /several publishes: name one of site, ws/, 'and says which there are when it cannot choose');
    const logs = await cli(['svc', 'logs', 'web', 'www', '-p', 'svc', '-n', '3']);
    t.equal(logs.code, 0, logs.out);
  });

  t.test('stop and resume the box: 503 meanwhile, the service back after', async (t) => {
    t.equal((await host.call('POST', `${P}/web/stop?wait=60`)).status, 200);
    const down = await viaProxy(proxyUrl, 'site--web--svc.localhost', { token: host.adminToken });
    t.equal(down.status, 503, 'a stopped box: 503');
    t.match(JSON.parse(down.body).error, { code: 'unavailable', message: /box svc\/web is stopped/ });
    t.equal((await host.call('GET', `${P}/web/services`)).status, 409, 'services of a stopped box: 409');
    t.equal((await host.call('POST', `${P}/web/resume?wait=60`)).status, 200);
    let back = 0;
    for (let i = 0; i < 50 && back !== 200; i++) {
      await sleep(200);
      back = (await viaProxy(proxyUrl, 'site--web--svc.localhost', { token: host.adminToken })).status;
    }
    t.equal(back, 200, 'boxd started the service with the box; the publish answers again');
    t.equal((await host.call('GET', `${P}/web/services/www`)).body.state, 'running');
  });

  t.test('services outlive the api, the worker and the node agent; the box deleted, its publishes vanish', async (t) => {
    const before = (await host.call('GET', `${P}/web/services/www`)).body;
    // The whole host process's part goes (api, proxy, worker, node agent), the box stays.
    await host.close();
    const again = await startHost(host.config, { roles: ['api', 'node'], log: pino({ level: 'silent' }) });
    t.teardown(() => again.close());
    const call = (method: string, p: string) => request(again.url!, method, p, again.adminToken);
    const after = (await call('GET', `${P}/web/services/www`)).body;
    t.match(after, { state: 'running', pid: before.pid, restarts: before.restarts }, 'the same process, never restarted');
    const site = await viaProxy(again.proxyUrl!, 'site--web--svc.localhost', { token: again.adminToken });
    t.equal(site.body, 'hello-from-box\n', "the new process's proxy reaches it");

    t.equal((await call('DELETE', `${P}/web?wait=60`)).status, 204);
    t.equal((await viaProxy(again.proxyUrl!, 'site--web--svc.localhost', { token: again.adminToken })).status, 404, 'deleted: its publishes are gone');
    t.equal(Number((await again.db('publishes').count({ n: '*' }))[0].n), 0, 'no publish row is left');
  });
});
