import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { execFile, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import t from 'tap';
import type { Test as Tap } from 'tap';
import { startTestHost } from './helpers/host';
import { archive } from './helpers/tarball';

/**
 * Bases on a real host (docs/bases.md): the built-in busybox base; a box saved as a base seeds
 * new boxes with its files and owners; export and import round-trip (tar and gzip, binary and
 * JSON forms); hostile tarballs are refused with the entry named and leave no record, upload or
 * dataset; the import size limit is 413; a base a box was made from cannot be deleted; a saved
 * base is its project's alone; the CLI.
 */



const MAIN = path.resolve(__dirname, '..', 'cli', 'main.js');
const IMPORT_LIMIT = 8 * 1024 * 1024;

t.test('bases on a real host', async (t) => {
  // A small bound on base versions, so that the test reaches it (imports hold 3 after devnode).
  const host = await startTestHost(t, { BOXHOST_BASE_IMPORT_MAX_BYTES: String(IMPORT_LIMIT), BOXHOST_BASES_MAX_PER_PROJECT: '3' });
  const P = '/v1/projects/bp/boxes';
  const call = (method: string, p: string, body?: unknown) => host.call(method, p, { body });
  const sh = async (box: string, script: string, project = 'bp') => {
    const r = await call('POST', `/v1/projects/${project}/boxes/${box}/exec`, { command: ['sh', '-c', script] });
    if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`exec in ${box}: ${r.status} ${r.text}`);
    return r.body as { stdout: string; stderr: string; exit_code: number };
  };
  const finish = async (t: Tap, r: { status: number; headers: Headers; text: string }) => {
    t.equal(r.status, 202, `accepted: ${r.text.slice(0, 300)}`);
    t.match(r.headers.get('location') ?? '', /^\/v1\/bases\/[a-z0-9-]+@[0-9a-f]{12}$/, 'Location: the base being made');
    return (await call('GET', `/v1/operations/${r.headers.get('operation-id')}/wait?timeout=120`)).body;
  };
  const pool = `boxhost-${host.config.hostTag}`;
  const datasets = () => execFileSync('zfs', ['list', '-H', '-o', 'name', '-r', pool]).toString().split('\n').filter(Boolean);
  const staged = () => fs.readdirSync(path.join(host.config.dataDir, 'imports'), { withFileTypes: true }).map((d) => d.name);
  const download = async (spec: string) => {
    const res = await fetch(`${host.url}/v1/bases/${spec}/export`, { headers: { authorization: `Bearer ${host.adminToken}` } });
    t.equal(res.status, 200);
    t.equal(res.headers.get('content-type'), 'application/x-tar');
    return Buffer.from(await res.arrayBuffer());
  };
  const upload = (name: string, bytes: Buffer, contentType = 'application/x-tar') =>
    host.call('POST', `/v1/bases/import?name=${name}`, { raw: bytes, contentType });

  t.test('the built-in busybox base', async (t) => {
    const l = await call('GET', '/v1/bases');
    t.equal(l.status, 200);
    const bb = l.body.bases.find((b: any) => b.name === 'busybox');
    t.match(bb, { name: 'busybox', origin: 'builtin', project: null, version: /^[0-9a-f]{12}$/ });
    t.ok(bb.size_bytes > 0);
    t.same((await call('GET', '/v1/bases/busybox')).body, bb, 'GET by name is the newest version');
    t.same((await call('GET', `/v1/bases/busybox@${bb.version}`)).body, bb, 'and by name@version');
    t.equal((await call('GET', '/v1/bases/nope')).status, 404);
    t.equal((await call('GET', '/v1/bases/busybox@000000000000')).status, 404);
    t.equal((await call('GET', '/v1/bases/Bad_Name')).status, 400);
    const del = await call('DELETE', '/v1/bases/busybox');
    t.equal(del.status, 409, 'a built-in base stays');
  });

  let saved: { name: string; version: string };
  t.test('save a box as a base: a new box has its files and owners', async (t) => {
    t.equal((await call('POST', `${P}?wait=120`, { name: 'src' })).body.status, 'running');
    await sh('src', 'echo hello-from-src > /root/hello && ln -s /root/hello /root/link');
    // Boxes have no CAP_CHOWN: a file of the box user is made by the box user.
    const mine = await call('POST', `${P}/src/exec`, { command: ['sh', '-c', 'echo mine > /home/box/mine'], user: 'box' });
    t.equal(mine.body?.exit_code, 0, mine.text);
    const r = await call('POST', '/v1/projects/bp/bases', { box: 'src', name: 'web', builder: 'test', script: 'echo hi', parent_alias: 'busybox' });
    t.match(r.body, { name: 'web', version: /^[0-9a-f]{12}$/, size_bytes: 0 });
    saved = { name: 'web', version: r.body.version };
    const op = await finish(t, r);
    t.equal(op.status, 'succeeded', JSON.stringify(op));
    t.equal(op.resource, `/v1/bases/web@${saved.version}`);
    const got = await call('GET', '/v1/bases/web');
    t.match(got.body, { name: 'web', version: saved.version, origin: 'saved', project: 'bp', builder: 'test', script: 'echo hi', parent_alias: 'busybox' });
    t.ok(got.body.size_bytes > 0, 'its size is known');
    t.equal((await call('GET', `${P}/src`)).body.status, 'running', 'the box runs on');
    t.equal((await sh('src', 'echo ok')).stdout, 'ok\n', 'and is not frozen');

    const again = await call('POST', '/v1/projects/bp/bases', { box: 'src', name: 'web', script: 'echo hi', parent_alias: 'busybox' });
    t.equal(again.status, 409, 'the same build inputs give the same version: taken');

    const made = await call('POST', `${P}?wait=120`, { name: 'from-web', base: 'web' });
    t.equal(made.body.status, 'running', made.text);
    t.equal(made.body.base, `web@${saved.version}`);
    t.equal((await sh('from-web', 'cat /root/hello')).stdout, 'hello-from-src\n');
    t.equal((await sh('from-web', 'stat -c %u:%g /home/box/mine /root/hello')).stdout, '1000:1000\n0:0\n', 'owners are box ids again');
    t.equal((await sh('from-web', 'readlink /root/link')).stdout, '/root/hello\n');

    // A stopped box is saved as well.
    t.equal((await call('POST', `${P}/src/stop?wait=120`)).body.status, 'stopped');
    const second = await call('POST', '/v1/projects/bp/bases?wait=120', { box: 'src', name: 'web' });
    t.equal(second.status, 200, second.text);
    t.not(second.body.version, saved.version, 'a second version');
    const newest = await call('GET', '/v1/bases/web');
    t.equal(newest.body.version, second.body.version, '`web` is the newest version');
    t.equal((await call('POST', `${P}/src/resume?wait=120`)).body.status, 'running');

    for (const bad of [{ box: 'src' }, { box: 'src', name: 'A' }, { name: 'x' }, { box: 'src', name: 'x', script_sha256: 'nothex' }, { box: 'src', name: 'x', extra: 1 }]) {
      t.equal((await call('POST', '/v1/projects/bp/bases', bad)).status, 400, `400 for ${JSON.stringify(bad)}`);
    }
    t.equal((await call('POST', '/v1/projects/bp/bases', { box: 'none', name: 'x' })).status, 404);
    t.equal((await call('POST', '/v1/projects/bp/bases', { box: 'src', name: 'busybox' })).status, 409, 'a built-in name');
  });

  t.test("a saved base is its project's", async (t) => {
    const other = (await call('POST', '/v1/tokens', { name: 'base-other', projects: ['bq'] })).body.token;
    const as = (method: string, p: string, body?: unknown) => host.call(method, p, { body, token: other });
    t.notOk((await as('GET', '/v1/bases')).body.bases.some((b: any) => b.name === 'web'), 'not listed');
    t.equal((await as('GET', '/v1/bases/web')).status, 404);
    t.equal((await as('GET', '/v1/bases/web/export')).status, 404);
    t.equal((await as('DELETE', '/v1/bases/web')).status, 404);
    const box = await as('POST', '/v1/projects/bq/boxes', { name: 'x', base: 'web' });
    t.equal(box.status, 400, 'no box from it in another project');
    t.equal(box.body.error.details[0].field, 'base');
    const admin = await call('POST', '/v1/projects/bq/boxes', { name: 'x', base: 'web' });
    t.equal(admin.status, 400, 'not even with a token that reaches both: it seeds only its own project');
    t.equal((await as('POST', '/v1/projects/bq/bases', { box: 'src', name: 'web' })).status, 404, 'no box src in bq');
    // A project-limited token's import is its project's, as a save is: never every project's
    // (one project would put its files under a name others make boxes from).
    const mine = await host.call('POST', '/v1/bases/import?name=bq-own&wait=60', { raw: archive([{ path: 'etc/x', body: 'bq' }]), contentType: 'application/x-tar', token: other });
    t.equal(mine.status, 200, mine.text);
    t.match(mine.body, { name: 'bq-own', origin: 'imported', project: 'bq' });
    const opId = mine.headers.get('operation-id');
    t.equal((await as('GET', `/v1/operations/${opId}`)).status, 200, 'its operation is visible to it');
    const seeds = await call('POST', `${P}?wait=60`, { name: 'from-bq', base: 'bq-own' });
    t.equal(seeds.status, 400, 'it seeds no box of another project');
    t.equal(seeds.body.error.details[0].field, 'base');
    const more = await host.call('POST', '/v1/bases/import?name=bq-own&wait=60', { raw: archive([{ path: 'etc/x', body: 'two' }]), contentType: 'application/x-tar', token: other });
    t.equal(more.status, 200, `its project adds versions to its own name: ${more.text}`);
    const elsewhere = await host.call('POST', '/v1/bases/import?name=bq-else&project=bp', { raw: archive([{ path: 'etc/x', body: 'x' }]), contentType: 'application/x-tar', token: other });
    t.equal(elsewhere.status, 404, 'not into a project it does not reach');
    t.equal((await host.call('POST', '/v1/bases/import?name=bq-own', { raw: archive([{ path: 'etc/x', body: 'x' }]), contentType: 'application/x-tar' })).status, 409, "an everyone's import cannot take a project's name");
    t.equal((await as('DELETE', '/v1/bases/bq-own')).status, 204, 'and deletes them');
    // A token without a limit imports for a project when asked.
    const forBq = await host.call('POST', '/v1/bases/import?name=bq-given&project=bq&wait=60', { raw: archive([{ path: 'etc/x', body: 'x' }]), contentType: 'application/x-tar' });
    t.match(forBq.body, { name: 'bq-given', project: 'bq' });
    t.equal((await as('GET', '/v1/bases/bq-given')).status, 200);
    t.equal((await call('DELETE', '/v1/bases/bq-given')).status, 204);
  });

  t.test("a project's bases count in its storage quota (whole GB, rounded up)", async (t) => {
    const usage = async (p: string) => {
      const r = await call('GET', `/v1/projects/${p}`);
      if (r.status !== 200) throw new Error(`project ${p}: ${r.status} ${r.text}`);
      return r.body.usage.storage_gb as number;
    };
    const tar = (body: string) => ({ raw: archive([{ path: 'etc/x', body }]), contentType: 'application/x-tar' });
    t.equal((await call('PUT', '/v1/projects/bspace', { quotas: { storage_gb: 1 } })).status, 200);
    t.equal(await usage('bspace'), 0, 'nothing yet');
    const first = await host.call('POST', '/v1/bases/import?name=bspace-a&project=bspace&wait=60', tar('a'));
    t.equal(first.status, 200, first.text);
    t.equal(await usage('bspace'), 1, 'a small base takes 1 GB of it');
    const second = await host.call('POST', '/v1/bases/import?name=bspace-a&project=bspace&wait=60', tar('a2'));
    t.equal(second.status, 200, `a second small one fits in the same GB: ${second.text}`);
    t.equal(await usage('bspace'), 1, 'rounded up once over all of them, not per base');
    t.equal((await call('PUT', '/v1/projects/bspace', { quotas: { storage_gb: 0 } })).status, 200);
    const again = await host.call('POST', '/v1/bases/import?name=bspace-a&project=bspace&wait=60', tar('a2'));
    t.equal(again.status, 200, `the same bytes again add nothing: ${again.text}`);
    t.equal((await call('DELETE', '/v1/bases/bspace-a')).status, 204);
    t.equal(await usage('bspace'), 0, 'a deleted base gives its space back');
    const before = staged();
    const over = await host.call('POST', '/v1/bases/import?name=bspace-b&project=bspace', tar('b'));
    t.equal(over.status, 429, `an import past the quota: ${over.text}`);
    t.equal(over.body.error.details[0].field, 'config.storage_gb');
    t.ok(Number(over.headers.get('retry-after')) > 0, 'Retry-After');
    t.same(staged(), before, 'its upload is not kept');
    t.equal((await call('GET', '/v1/bases/bspace-b')).status, 404, 'nor a record of it');
    // A save asks for a GB to be free: bp at its quota refuses one.
    const bp = await usage('bp');
    t.equal((await call('PUT', '/v1/projects/bp', { quotas: { storage_gb: bp } })).status, 200);
    const save = await call('POST', '/v1/projects/bp/bases', { box: 'src', name: 'web-full' });
    t.equal(save.status, 429, `a save past the quota: ${save.text}`);
    t.equal(save.body.error.details[0].field, 'config.storage_gb');
    t.equal((await call('PUT', '/v1/projects/bp', { quotas: { storage_gb: null } })).status, 200);
  });

  t.test('a base asks its node for room too: 507 when the node has promised all its storage', async (t) => {
    const tar = (body: string) => ({ raw: archive([{ path: 'etc/x', body }]), contentType: 'application/x-tar' });
    const node = (await call('GET', '/v1/nodes/local')).body;
    const free = node.allocatable.disk_gb - node.committed.disk_gb;
    t.ok(free > 0 && free <= 16384, `the node has ${free} GB it may still promise (one volume can take it)`);
    // A data volume with no project takes the rest (its quota is a promise, not space used).
    const deleteFill = async () => {
      const del = await call('DELETE', '/v1/data/bnode-fill');
      if (del.status === 202) await call('GET', `/v1/operations/${del.headers.get('operation-id')}/wait?timeout=60`);
      return del.status;
    };
    t.teardown(async () => void (await deleteFill()));
    const fill = await call('POST', '/v1/data', { name: 'bnode-fill', size_gb: free });
    t.ok([201, 202].includes(fill.status), `a volume takes the rest: ${fill.text}`);
    if (fill.status === 202) await call('GET', `/v1/operations/${fill.headers.get('operation-id')}/wait?timeout=60`);
    const before = staged();
    const imp = await host.call('POST', '/v1/bases/import?name=bnode-a&project=bnode', tar('a'));
    t.equal(imp.status, 507, `an import: ${imp.text}`);
    t.equal(imp.body.error.code, 'insufficient_storage');
    t.same(imp.body.error.details, [{ field: 'config.storage_gb', issue: 'no node has room for it' }]);
    t.same(staged(), before, 'its upload is not kept');
    t.equal((await call('GET', '/v1/bases/bnode-a')).status, 404, 'nor a record of it');
    const save = await call('POST', '/v1/projects/bp/bases', { box: 'src', name: 'bnode-saved' });
    t.equal(save.status, 507, `a save: ${save.text}`);
    t.equal(save.body.error.code, 'insufficient_storage');
    t.equal((await call('GET', '/v1/bases/bnode-saved')).status, 404, 'no base reserved');
    // Control: with the volume gone the same import goes in.
    t.ok([202, 204].includes(await deleteFill()), 'the volume deleted');
    const ok = await host.call('POST', '/v1/bases/import?name=bnode-a&project=bnode&wait=60', tar('a'));
    t.equal(ok.status, 200, ok.text);
    t.equal((await call('DELETE', '/v1/bases/bnode-a')).status, 204);
  });

  t.test('export and import round-trip; the same bytes are the same version', async (t) => {
    const tarball = await download('web');
    const names = execFileSync('tar', ['-tf', '-'], { input: tarball }).toString().split('\n');
    t.ok(names.includes('root/hello'), 'entries at the tar root');
    t.notOk(names.some((n) => n.startsWith('/') || n.startsWith('./')), 'no absolute or ./ names');

    const r = await upload('webcopy', tarball);
    t.match(r.body, { name: 'webcopy', version: /^[0-9a-f]{12}$/ });
    const op = await finish(t, r);
    t.equal(op.status, 'succeeded', JSON.stringify(op));
    const got = (await call('GET', '/v1/bases/webcopy')).body;
    t.match(got, { origin: 'imported', project: null });
    t.equal(got.version, execFileSync('sha256sum', { input: tarball }).toString().slice(0, 12), 'version = sha256 of the upload');
    const made = await call('POST', `${P}?wait=120`, { name: 'from-copy', base: 'webcopy' });
    t.equal(made.body.status, 'running', made.text);
    t.equal((await sh('from-copy', 'cat /root/hello; stat -c %u /home/box/mine')).stdout, 'hello-from-src\n1000\n');

    const gz = zlib.gzipSync(tarball);
    const json = await call('POST', '/v1/bases/import?wait=120', { name: 'webgz', data_base64: gz.toString('base64'), builder: 'json-form' });
    t.equal(json.status, 200, json.text);
    t.match(json.body, { name: 'webgz', builder: 'json-form', version: execFileSync('sha256sum', { input: gz }).toString().slice(0, 12) });
    const twice = await upload('webcopy', tarball);
    t.equal((await finish(t, twice)).status, 'succeeded', 'the same bytes again');
    t.equal((await call('GET', '/v1/bases')).body.bases.filter((b: any) => b.name === 'webcopy').length, 1, 'still one version');
    t.same(staged(), [], 'no upload is left behind');
    t.equal((await upload('busybox', tarball)).status, 409, 'a built-in name');
    t.equal((await upload('web', tarball)).status, 409, "a project's name");
    t.equal((await host.call('POST', '/v1/bases/import', { raw: tarball, contentType: 'application/x-tar' })).status, 400, 'the binary form needs ?name=');
    t.equal((await call('POST', '/v1/bases/import', { name: 'x', data_base64: '!!!' })).status, 400, 'not base64');
  });

  t.test('hostile tarballs are refused, naming the entry, and leave nothing', async (t) => {
    const before = datasets();
    const cases: [string, Buffer, RegExp][] = [
      ['absolute', archive([{ path: '/etc/cron.d/x', body: 'x' }]), /absolute path/],
      ['dotdot', archive([{ path: '../../../../tmp/boxhost-escape', body: 'x' }]), /"\.\." segment/],
      ['through-link', archive([{ path: 'etc', type: 'SymbolicLink', linkpath: '/etc' }, { path: 'etc/boxhost-pwned', body: 'x' }]), /written through/],
      ['link-out', archive([{ path: 'x', type: 'SymbolicLink', linkpath: '../../../../etc' }]), /outside the base's root/],
      ['hardlink-out', archive([{ path: 'shadow', type: 'Link', linkpath: '/etc/shadow' }]), /hard link/],
      ['not-tar', Buffer.from('just some text, certainly not a tarball'.repeat(40)), /not a valid tar|type/],
    ];
    for (const [name, bytes, why] of cases) {
      const r = await upload(`evil-${name}`, bytes);
      t.equal(r.status, 400, `${name}: ${r.text}`);
      t.equal(r.body.error.code, 'invalid_argument');
      t.match(r.body.error.message, why, `${name}: says why`);
      t.equal(r.body.error.details[0].field, 'body');
      t.equal((await call('GET', `/v1/bases/evil-${name}`)).status, 404, `${name}: no base`);
    }
    t.notOk(fs.existsSync('/etc/boxhost-pwned'));
    t.notOk(fs.existsSync('/tmp/boxhost-escape'));
    const big = await upload('evil-big', Buffer.alloc(IMPORT_LIMIT + 1024));
    t.equal(big.status, 413, 'over BOXHOST_BASE_IMPORT_MAX_BYTES');
    t.equal(big.body.error.code, 'payload_too_large');
    t.same(staged(), [], 'no upload is left');
    t.same(datasets(), before, 'no dataset is left');
    // A device node is dropped, not refused: the base comes without it.
    const dev = await upload('devnode', archive([{ path: 'dev/', type: 'Directory' }, { path: 'dev/sda', type: 'BlockDevice' }, { path: 'etc/ok', body: 'fine' }]));
    t.equal((await finish(t, dev)).status, 'succeeded');
    t.ok((await call('GET', '/v1/bases/devnode')).body.size_bytes >= 0);
    // webcopy, webgz, devnode: the imports' bound of 3 is reached.
    const full = await upload('onemore', archive([{ path: 'etc/x', body: 'x' }]));
    t.equal(full.status, 409, full.text);
    t.match(full.body.error.message, /BOXHOST_BASES_MAX_PER_PROJECT/);
    t.same(staged(), [], 'refused before the upload was kept');
  });

  t.test('delete: 409 while a box was made from it, then gone with its dataset', async (t) => {
    const inUse = await call('DELETE', '/v1/bases/webcopy');
    t.equal(inUse.status, 409, inUse.text);
    t.match(inUse.body.error.message, /in use by 1 box/);
    t.equal((await call('DELETE', `${P}/from-copy?wait=120`)).status, 204);
    const del = await call('DELETE', '/v1/bases/webcopy');
    t.equal(del.status, 204, del.text);
    t.equal((await call('GET', '/v1/bases/webcopy')).status, 404);
    t.notOk(datasets().some((d) => d.includes('/bases/webcopy')), 'its datasets are gone');
    t.equal((await call('DELETE', '/v1/bases/webcopy')).status, 404);
    // Pinned: one version of `web` goes, the other stays.
    const versions = (await call('GET', '/v1/bases')).body.bases.filter((b: any) => b.name === 'web').map((b: any) => b.version);
    t.equal(versions.length, 2);
    const unused = versions.find((v: string) => v !== saved.version);
    t.equal((await call('DELETE', `/v1/bases/web@${unused}`)).status, 204);
    t.equal((await call('DELETE', '/v1/bases/web')).status, 409, 'the version from-web was made from stays');
  });

  t.test('the CLI', async (t) => {
    const env = { ...process.env, BOXHOST_URL: host.url, BOXHOST_TOKEN: host.adminToken };
    // Not execFileSync: the host answering the CLI runs in this process.
    const box = async (...args: string[]) => (await promisify(execFile)(process.execPath, [MAIN, ...args], { env, encoding: 'utf8' })).stdout;
    const ls = JSON.parse(await box('base', 'ls', '--json'));
    t.ok(ls.bases.some((b: any) => b.name === 'busybox'));
    t.match(await box('base', 'ls'), /busybox/);
    const file = path.join(host.config.dataDir, 'web.tar');
    await box('base', 'export', 'web', '-o', file);
    t.ok(fs.statSync(file).size > 1024, 'exported to a file');
    const imported = JSON.parse(await box('base', 'import', file, '--name', 'cli-web', '--json'));
    t.match(imported, { name: 'cli-web', origin: 'imported' });
    const savedCli = JSON.parse(await box('base', 'save', 'bp/src', 'cli-saved', '--json'));
    t.match(savedCli, { name: 'cli-saved', project: 'bp' });
    t.match(JSON.parse(await box('base', 'get', 'cli-saved', '--json')), { name: 'cli-saved' });
    await box('base', 'rm', 'cli-web');
    await box('base', 'rm', 'cli-saved');
    t.equal((await call('GET', '/v1/bases/cli-web')).status, 404);
  });
});
