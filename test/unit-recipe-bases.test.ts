import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { createDb, migrate } from '../db/knex';
import { createLogger } from '../core/logger';
import { DEBIAN_RECIPE, recipeOf, recipeVersion } from '../core/recipeBases';
import { basesRepo } from '../db/repos/bases';
import { MockStorage } from '../workers/storage/mock';
import { RecipeBases } from '../workers/bases/recipeBases';
import { mmdebstrapArgs } from '../workers/bases/debianRootfs';
import { parseAptSources, readAptSources, sourceEndpoints, sourceLine, sourcesForSuite } from '../workers/bases/aptSources';

/**
 * Recipe bases without mmdebstrap (docs/bases.md "The debian base"): the version rule, the
 * node's apt sources as read and filtered, mmdebstrap's arguments, and RecipeBases making a base
 * once for any number of callers, recording it, refusing versions it cannot make, and leaving
 * nothing when the making fails. test/debian.test.ts makes the real one.
 */

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'boxhost-unit-recipe-'));
const db = createDb({ dataDir, databaseUrl: undefined });
const log = createLogger('silent');
t.before(() => migrate(db));
t.teardown(async () => {
  await db.destroy();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

t.test('the version is the recipe\'s hash: stable, and changed by any part of it', async (t) => {
  const v = recipeVersion(DEBIAN_RECIPE);
  t.match(v, /^[0-9a-f]{12}$/);
  t.equal(recipeVersion({ ...DEBIAN_RECIPE, include: [...DEBIAN_RECIPE.include].reverse() }), v, 'package order does not matter');
  t.not(recipeVersion({ ...DEBIAN_RECIPE, include: [...DEBIAN_RECIPE.include, 'vim'] }), v);
  t.not(recipeVersion({ ...DEBIAN_RECIPE, suite: 'trixie' }), v);
  t.not(recipeVersion({ ...DEBIAN_RECIPE, revision: DEBIAN_RECIPE.revision + 1 }), v);
  t.equal(recipeOf({ name: 'debian', version: v }), DEBIAN_RECIPE);
  t.equal(recipeOf({ name: 'debian', version: '000000000000' }), undefined, 'only the current version can be made');
  t.equal(recipeOf({ name: 'busybox', version: v }), undefined);
});

t.test("the node's apt sources: both formats, only the suite's entries, disabled stanzas skipped", async (t) => {
  const deb822 = [
    'Types: deb deb-src',
    'URIs: http://deb.debian.org/debian',
    'Suites: bookworm bookworm-updates',
    'Components: main contrib',
    'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg',
    '',
    '# a comment',
    'Types: deb',
    'URIs: https://security.example/debian-security',
    'Suites: bookworm-security',
    'Components: main',
    '',
    'Types: deb',
    'URIs: http://off.example/debian',
    'Suites: bookworm',
    'Components: main',
    'Enabled: no',
    '',
    'Types: deb',
    'URIs: https://deb.nodesource.com/node_20.x',
    'Suites: nodistro',
    'Components: main',
  ].join('\n');
  const all = parseAptSources(deb822, 'sources');
  t.equal(all.length, 4, 'two suites of the first stanza, the second, the fourth; the disabled one skipped');
  const ours = sourcesForSuite(all, 'bookworm');
  t.same(ours.map(sourceLine), [
    'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main contrib',
    'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main contrib',
    'deb https://security.example/debian-security bookworm-security main',
  ]);
  t.same(sourceEndpoints(ours), [{ host: 'deb.debian.org', port: 80 }, { host: 'security.example', port: 443 }]);

  const list = parseAptSources([
    'deb http://ftp.example:8080/debian bookworm main # trailing',
    '# deb http://x/debian bookworm main',
    'deb-src http://y/debian bookworm main',
    'deb [arch=amd64 signed-by=/k.gpg] https://z/debian/ bookworm-backports main non-free',
    'deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main',
    'deb [signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/debian bookworm stable',
    'deb http://apt.postgresql.org/pub/repos/apt bookworm-pgdg main',
    'deb https://user:secret@private.example/debian bookworm main',
    'deb http://mirror.example/debian bookworm-updates contrib main weird',
  ].join('\n'), 'list');
  t.same(sourcesForSuite(list, 'bookworm').map(sourceLine), [
    'deb http://ftp.example:8080/debian bookworm main',
    'deb https://z/debian/ bookworm-backports main non-free',
    'deb http://mirror.example/debian bookworm-updates contrib main',
  ], "only Debian archives: not Docker's, PGDG's, a suite that only ends in the name, or one with credentials; a host keyring path and unknown components dropped");
  t.same(sourceEndpoints(sourcesForSuite(list, 'bookworm')), [{ host: 'ftp.example', port: 8080 }, { host: 'z', port: 443 }, { host: 'mirror.example', port: 80 }]);

  const dir = path.join(dataDir, 'apt');
  fs.mkdirSync(path.join(dir, 'sources.list.d'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'sources.list'), 'deb http://a/debian bookworm main\n');
  fs.writeFileSync(path.join(dir, 'sources.list.d', 'b.sources'), deb822);
  fs.writeFileSync(path.join(dir, 'sources.list.d', 'c.list.disabled'), 'deb http://c/debian bookworm main\n');
  const read = readAptSources([path.join(dir, 'sources.list'), path.join(dir, 'sources.list.d'), path.join(dir, 'missing')]);
  t.same(read.map((s) => s.uri), ['http://a/debian', 'http://deb.debian.org/debian', 'http://deb.debian.org/debian', 'https://security.example/debian-security', 'https://deb.nodesource.com/node_20.x'], 'files in order; other names and missing places skipped');
});

t.test("mmdebstrap's arguments: root mode, a tarball, the user, the sources as given", async (t) => {
  const args = mmdebstrapArgs(DEBIAN_RECIPE, [{ uri: 'http://deb.debian.org/debian', suite: 'bookworm', components: ['main'] }], '/w/rootfs.tar');
  t.same(args.slice(0, 5), ['/usr/bin/mmdebstrap', '--mode=root', '--variant=minbase', `--include=${DEBIAN_RECIPE.include.join(',')}`, '--format=tar']);
  t.ok(args.some((a) => a.includes('useradd') && a.includes('--uid 1000') && a.endsWith(' box')));
  t.same(args.slice(-3), ['bookworm', '/w/rootfs.tar', 'deb http://deb.debian.org/debian bookworm main']);
});

t.test('RecipeBases: one making for many callers, recorded once; other versions refused; a failed making leaves nothing', async (t) => {
  const storage = new MockStorage();
  let fills = 0;
  let fail: Error | null = null;
  const recipes = new RecipeBases({
    db, storage, log, workRoot: path.join(dataDir, 'recipes'), timeoutMs: 1000, limits: { maxUnpackedBytes: 1 << 30 },
    fill: async (dir) => {
      fills++;
      await new Promise((r) => setTimeout(r, 50));
      if (fail) throw fail;
      fs.writeFileSync(path.join(dir, 'os-release'), 'x'.repeat(1000));
    },
  });
  const ref = { name: 'debian', version: recipeVersion(DEBIAN_RECIPE) };

  fail = new Error('no mirror answers');
  await t.rejects(recipes.ensure(ref), /no mirror answers/);
  t.notOk(await storage.hasBase(ref), 'no half-made base');
  t.equal(await basesRepo.getAny(db, ref.name, ref.version), undefined, 'no record');

  fail = null;
  await t.rejects(recipes.ensure(ref), /no mirror answers/, 'for a while after, the same failure at once');
  t.equal(fills, 1, 'without making it again');
  (recipes as unknown as { failed: Map<string, { at: number }> }).failed.get(`${ref.name}@${ref.version}`)!.at -= RecipeBases.FAILURE_HOLD_MS;
  fills = 0;
  const made = await Promise.all([recipes.ensure(ref), recipes.ensure(ref), recipes.ensure(ref)]);
  t.equal(fills, 1, 'three callers at once, one making');
  t.same(made, [true, true, true], 'each waited for that making (made during its call)');
  t.ok(await storage.hasBase(ref));
  t.match(await basesRepo.getAny(db, ref.name, ref.version), { origin: 'builtin', state: 'ready', project: null, node: null, size_bytes: 1000 });
  t.equal(await recipes.ensure(ref), false, 'later: there already');
  t.equal(fills, 1);

  // Another process of the node (a new RecipeBases) finds the base and only records it.
  const other = new RecipeBases({ db, storage, log, workRoot: path.join(dataDir, 'recipes'), timeoutMs: 1000, limits: { maxUnpackedBytes: 1 << 30 }, fill: async () => void fills++ });
  t.equal(await other.ensure(ref), false);
  t.equal(fills, 1);

  await t.rejects(recipes.ensure({ name: 'debian', version: '0123456789ab' }), /only debian@[0-9a-f]{12} can be made/);
  t.ok(RecipeBases.isRecipe({ name: 'debian', version: 'x' }));
  t.notOk(RecipeBases.isRecipe({ name: 'busybox', version: 'x' }));
});

t.test('a bare recipe name is its current version: not an older one some node made, nor a row of another origin', async (t) => {
  const { resolveBase } = await import('../domain/baseResolve');
  const current = recipeVersion(DEBIAN_RECIPE);
  await db('bases').where({ name: 'debian' }).delete();
  // An older recipe version a node made (recorded after: newest by time).
  await basesRepo.ensure(db, { name: 'debian', version: 'aaaaaaaaaaaa', size_bytes: 5 });
  t.match(await resolveBase({ db }, null, 'debian'), { name: 'debian', version: current, size_bytes: 0 }, 'the current recipe, not made yet');
  t.match(await resolveBase({ db }, null, 'debian@aaaaaaaaaaaa'), { version: 'aaaaaaaaaaaa', size_bytes: 5 }, 'the older one, pinned');
  await basesRepo.ensure(db, { name: 'debian', version: current, size_bytes: 7 });
  t.match(await resolveBase({ db }, null, 'debian'), { version: current, size_bytes: 7 }, 'made: its record');
  // A project's saved base of that name from before the recipe existed does not take it over.
  await db('bases').where({ name: 'debian', version: current }).delete();
  await basesRepo.reserve(db, { name: 'debian', version: current, origin: 'saved', project: 'p', node: 'n', sha256: null, created_by: null, builder: null, parent: null, parent_alias: null, parent_version: null, script: null, script_sha256: null });
  await basesRepo.markReady(db, 'debian', current, 9);
  t.match(await resolveBase({ db }, null, 'debian'), { version: current, origin: 'builtin', size_bytes: 0 });
  t.equal(await resolveBase({ db }, null, 'debian@0123456789ab'), undefined);
  await db('bases').where({ name: 'debian' }).delete();
});
