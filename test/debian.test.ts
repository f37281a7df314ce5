import dns from 'node:dns';
import t from 'tap';
import { startTestHost } from './helpers/host';
import { DEBIAN_RECIPE, recipeVersion } from '../core/recipeBases';
import { run } from '../core/command';
import { PackageSources } from '../workers/bases/packageSources';

/**
 * The `debian` base on a real host (docs/bases.md "The debian base"): listed before any node made
 * it, made with mmdebstrap from the host's own apt sources by the first box that needs it, a box
 * from it has bash, apt, coreutils, ca-certificates and the user `box`; later boxes (another
 * project's too, in its own id range) are clones; `POST /v1/bases/debian/build` on a node that has
 * it only records it; the name is the node's.
 */

const version = recipeVersion(DEBIAN_RECIPE);

t.test('the debian base on a real host', async (t) => {
  const host = await startTestHost(t);
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const exec = async (project: string, box: string, command: string[], extra: Record<string, unknown> = {}) => {
    const r = await call('POST', `/v1/projects/${project}/boxes/${box}/exec`, { command, ...extra });
    if (r.status !== 200) throw new Error(`exec ${command.join(' ')}: ${r.status} ${r.text}`);
    return r.body as { exit_code: number; stdout: string; stderr: string };
  };
  /** A create followed to its end (the first one from debian takes minutes). */
  const create = async (project: string, body: Record<string, unknown>) => {
    const r = await call('POST', `/v1/projects/${project}/boxes`, body);
    if (r.status === 201) return r;
    if (r.status !== 202) throw new Error(`create: ${r.status} ${r.text}`);
    for (let i = 0; i < 4; i++) {
      const op = (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=300`)).body;
      if (op.status === 'succeeded' || op.status === 'failed') break;
    }
    return call('GET', `/v1/projects/${project}/boxes/${body.name}`);
  };

  t.test('before any node made it: listed and got as its recipe version, no size yet; unknown recipes are 404', async (t) => {
    const list = (await call('GET', '/v1/bases')).body.bases as any[];
    t.match(list.find((b) => b.name === 'debian'), { name: 'debian', version, origin: 'builtin', project: null, size_bytes: 0 });
    const got = (await call('GET', '/v1/bases/debian')).body;
    t.match(got, { name: 'debian', version, created_at: DEBIAN_RECIPE.published });
    await new Promise((r) => setTimeout(r, 20));
    t.equal((await call('GET', '/v1/bases/debian')).body.created_at, got.created_at, 'the same created_at on every read');
    t.equal((await call('GET', `/v1/bases/debian@${version}`)).status, 200);
    t.equal((await call('GET', '/v1/bases/debian@000000000000')).status, 404, 'only the recipe version exists');
    for (const name of ['nope', 'busybox']) {
      const r = await call('POST', `/v1/bases/${name}/build`, {});
      t.equal(r.status, 404, `${name} is no recipe`);
      t.equal(r.body.error.code, 'not_found');
    }
    const exported = await call('GET', '/v1/bases/debian/export');
    t.equal(exported.status, 409, 'not made on the node yet: nothing to export');
    t.match(exported.body.error.message, /box base build debian --node /);
    t.equal((await call('DELETE', '/v1/bases/debian')).status, 409, 'built in, made or not');
  });

  t.test('the first box from debian makes it; the box has bash, apt, coreutils, ca-certificates, user box', async (t) => {
    const started = Date.now();
    const r = await create('deb', { name: 'one', base: 'debian' });
    t.ok(r.status === 200 || r.status === 201, r.text.slice(0, 300));
    t.match(r.body, { status: 'running', base: `debian@${version}` });
    t.comment(`first box from debian (mmdebstrap included): ${((Date.now() - started) / 1000).toFixed(1)} s`);
    const apt = await exec('deb', 'one', ['bash', '-c', 'apt --version']);
    t.equal(apt.exit_code, 0, apt.stderr);
    t.match(apt.stdout, /^apt 2\.\d+/);
    t.match((await exec('deb', 'one', ['cat', '/etc/os-release'])).stdout, /VERSION_CODENAME=bookworm/);
    t.match((await exec('deb', 'one', ['ls', '--version'])).stdout, /GNU coreutils/);
    t.equal((await exec('deb', 'one', ['test', '-s', '/etc/ssl/certs/ca-certificates.crt'])).exit_code, 0, 'ca-certificates is installed');
    t.match((await exec('deb', 'one', ['id', 'box'])).stdout, /^uid=1000\(box\) gid=1000\(box\)/);
    const asBox = await exec('deb', 'one', ['bash', '-lc', 'echo "$(id -un) $HOME $SHELL"; touch ~/mine'], { user: 'box' });
    t.equal(asBox.stdout.trim(), 'box /home/box /bin/bash', asBox.stderr);
    t.equal((await exec('deb', 'one', ['dpkg-query', '-W', '-f=${Status}', 'bash'])).stdout, 'install ok installed', 'dpkg knows its packages');
    t.match((await exec('deb', 'one', ['cat', '/etc/apt/sources.list'])).stdout, /^deb .*bookworm main/m, "the node's sources, kept for apt");
    t.equal((await exec('deb', 'one', ['sh', '-c', 'ls /dev/sda* /dev/mem 2>/dev/null | wc -l'])).stdout.trim(), '0', 'no host device nodes');

    const base = (await call('GET', '/v1/bases/debian')).body;
    t.match(base, { name: 'debian', version, origin: 'builtin' });
    t.ok(base.size_bytes > 50 * 1024 * 1024, `a real root (${base.size_bytes} bytes)`);
    t.same((await call('GET', '/v1/bases')).body.bases.filter((b: any) => b.name === 'debian').map((b: any) => b.version), [version], 'listed once');
  });

  t.test('later boxes are clones, in their own project range too; a build of it only records it', async (t) => {
    const started = Date.now();
    const r = await call('POST', '/v1/projects/deb2/boxes?wait=120', { name: 'two', base: `debian@${version}` });
    t.equal(r.status, 200, r.text.slice(0, 300));
    t.match(r.body, { status: 'running' });
    t.comment(`a second box from debian, another project: ${((Date.now() - started) / 1000).toFixed(1)} s`);
    t.equal((await exec('deb2', 'two', ['test', '-e', '/home/box/mine'])).exit_code, 1, "one box's files are not another's");
    t.equal((await exec('deb2', 'two', ['bash', '-c', 'apt-get --version >/dev/null && echo ok'])).stdout, 'ok\n');

    const b = await call('POST', '/v1/bases/debian/build?wait=60', {});
    t.equal(b.status, 200, b.text);
    t.match(b.body, { name: 'debian', version });
    const op = (await call('GET', `/v1/operations/${b.headers.get('operation-id')}`)).body;
    t.equal(op.status, 'succeeded');
    t.ok(host.logs.some((l) => l.msg === 'recipe base was there'), 'the node had it: nothing made again');

    const exported = await fetch(`${host.url}/v1/bases/debian/export`, { headers: { authorization: `Bearer ${host.adminToken}` } });
    t.equal(exported.status, 200, 'made on the node: it exports');
    await exported.body?.cancel();
  });

  t.test("a build from debian installs packages through the node's proxy; no box reaches the sources directly", async (t) => {
    // The first http source the node's apt lists, and an address it has.
    const [source] = new PackageSources().endpoints();
    t.ok(source, 'this host has an http Debian package source');
    const address = (await dns.promises.lookup(source.host, { family: 4 })).address;
    const direct = `curl -sS -m 8 --noproxy '*' -o /dev/null -H 'Host: ${source.host}' http://${address}:${source.port}/`;
    const plain = await exec('deb', 'one', ['bash', '-c', `${direct}; echo " exit=$?"`]);
    t.match(plain.stdout, /exit=(7|28)\b/, `an ordinary box cannot connect to the source (${plain.stdout.trim()} ${plain.stderr.trim()})`);

    const script = [
      'echo "proxy=$http_proxy"',
      `if ${direct} 2>/dev/null; then echo direct-open; else echo direct-closed; fi`,
      "echo \"elsewhere=$(curl -s -m 8 -o /dev/null -w '%{http_code}' http://example.org/)\"",
      'apt-get update -q && apt-get install -y -q --no-install-recommends hello && hello',
    ].join('\n');
    const started = Date.now();
    const r = await call('POST', '/v1/base-builds', { base: 'deb-hello', parent: 'debian', script });
    t.equal(r.status, 202, r.text);
    const op = (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=300`)).body;
    const log = (await host.call('GET', `/v1/base-builds/${r.body.id}/logs`)).text;
    t.equal(op.status, 'succeeded', `${JSON.stringify(op.error)}\n${log.slice(-2000)}`);
    t.comment(`a build from debian with apt-get update + install: ${((Date.now() - started) / 1000).toFixed(1)} s`);
    t.match(log, /proxy=http:\/\/\d+\.\d+\.\d+\.\d+:\d+\//, 'the script found the proxy in http_proxy');
    t.match(log, /direct-closed/, 'even the build box cannot connect to the source itself');
    t.match(log, /elsewhere=403/, 'the proxy refuses a host that is no package source');
    t.match(log, /Hello, world!/, 'apt-get install worked in the build');
    const rules = await run(['iptables', '-w', '-S', `BH-${host.config.hostTag}-PKG`]);
    t.notMatch(rules.stdout, /-A /, 'nothing is left open once the build is over');

    const made = await call('POST', '/v1/projects/deb/boxes?wait=120', { name: 'hello', base: 'deb-hello' });
    t.equal(made.status, 200, made.text.slice(0, 300));
    t.equal((await exec('deb', 'hello', ['hello'])).stdout, 'Hello, world!\n', 'a box from the built base has the package');
    const after = await exec('deb', 'hello', ['bash', '-c', `${direct}; echo " exit=$?"; echo "proxy=\${http_proxy:-none}"`]);
    t.match(after.stdout, /exit=(7|28)\b/, 'a box from the built base is an ordinary box');
    t.match(after.stdout, /proxy=none/, 'with no proxy of the build in its environment');
  });

  t.test('the name is the nodes\': no save, import or delete takes it', async (t) => {
    const save = await call('POST', '/v1/projects/deb/bases', { box: 'one', name: 'debian' });
    t.equal(save.status, 409);
    t.match(save.body.error.message, /built-in/);
    const del = await call('DELETE', '/v1/bases/debian');
    t.equal(del.status, 409);
  });
});
