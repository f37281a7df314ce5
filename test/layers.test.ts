import fs from 'node:fs';
import path from 'node:path';
import t from 'tap';

/**
 * The layers import only downward (docs/architecture.md "Layers"): core at the bottom, the api
 * never reaching a host driver or a host program, jobs and workers not importing each other
 * both ways, the CLI sharing only the API types. Read from the TypeScript sources, so a new
 * import that breaks a rule fails here before it ships.
 */
const root = path.resolve(__dirname, '..', '..');

const LAYERS: Record<string, string[]> = {
  core: ['core'],
  db: ['core', 'db'],
  jobs: ['core', 'db', 'jobs'],
  cluster: ['core', 'cluster'],
  domain: ['core', 'db', 'jobs', 'cluster', 'domain'],
  api: ['core', 'db', 'jobs', 'domain', 'api'],
  workers: ['core', 'db', 'jobs', 'cluster', 'workers'],
  cli: ['cli', 'core/apiTypes', 'core/box', 'core/wsChannel'],
};

/** Layers that run no host program: no child processes, not even through a core module. */
const NO_HOST_PROGRAMS = ['core', 'db', 'jobs', 'cluster', 'domain', 'api', 'cli'];
/** The core modules that do spawn: the command runner (used by the node side) and the helper
 *  process it starts them from, the embedded redis-server (started by the composition root),
 *  `git rev-parse` for /version. */
const SPAWNERS = new Set(['core/command.ts', 'core/spawner.ts', 'core/redis.ts', 'core/version.ts']);

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(rel));
    else if (e.name.endsWith('.ts')) out.push(rel);
  }
  return out;
}

const read = (file: string) => fs.readFileSync(path.join(root, file), 'utf8');

/** Every module a text imports (static imports, re-exports, require, import()). */
const specifiers = (text: string) => [...text.matchAll(/(?:from\s+|require\(\s*|import\(\s*|^import\s+)['"]([^'"]+)['"]/gm)].map((m) => m[1]);

/** The repo modules a file imports, as paths from the repo root (no extension). */
const importsOf = (file: string, text = read(file)) =>
  specifiers(text)
    .filter((s) => s.startsWith('.'))
    .map((s) => path.normalize(path.join(path.dirname(file), s)));

const runsHostPrograms = (file: string, text = read(file)) =>
  specifiers(text).some((s) => /^(node:)?child_process$/.test(s)) || importsOf(file, text).some((f) => f === 'core/command');

const allowed = (layer: string, target: string) => LAYERS[layer].some((l) => target === l || target.startsWith(`${l}/`));

t.test('each layer imports only the layers below it', async (t) => {
  const violations: string[] = [];
  let checked = 0;
  for (const layer of Object.keys(LAYERS)) {
    for (const file of sources(layer)) {
      for (const target of importsOf(file)) {
        checked++;
        if (!allowed(layer, target)) violations.push(`${file} imports ${target}`);
      }
    }
  }
  t.ok(checked > 100, `read ${checked} imports`);
  t.same(violations, [], 'no import runs back up');
});

t.test('the api reaches no host driver, not even through another module', async (t) => {
  // Everything api/ and domain/ load, followed through every import.
  const seen = new Set<string>();
  const stack = [...sources('api'), ...sources('domain')];
  while (stack.length) {
    const f = stack.pop()!;
    if (seen.has(f)) continue;
    seen.add(f);
    for (const target of importsOf(f)) {
      const file = [`${target}.ts`, path.join(target, 'index.ts')].find((c) => fs.existsSync(path.join(root, c)));
      if (file) stack.push(file);
    }
  }
  const reached = [...seen].filter((f) => f.startsWith('workers/') || f.startsWith('server/'));
  t.ok(seen.size > 50, `followed ${seen.size} files`);
  t.same(reached, [], 'no workers/ or server/ file is loaded by the api');
});

t.test('only the node side runs host programs', async (t) => {
  const offenders: string[] = [];
  for (const layer of NO_HOST_PROGRAMS) for (const file of sources(layer)) if (!SPAWNERS.has(file) && runsHostPrograms(file)) offenders.push(file);
  t.same(offenders, [], 'no module of api/, domain/, cluster/, jobs/, db/, cli/ or core/ (but the spawners) spawns a program');
});

t.test('the checks catch a violation (positive controls)', async (t) => {
  t.same(importsOf('api/routes/boxes/x.ts', "import { RuncRuntime } from '../../../workers/runtime/runc';"), ['workers/runtime/runc'], 'an import is read');
  t.notOk(allowed('api', 'workers/runtime/runc'), 'api → workers is refused');
  t.notOk(allowed('core', 'db/knex'), 'core → db is refused');
  t.notOk(allowed('jobs', 'workers/boxSteps'), 'jobs → workers is refused');
  t.ok(allowed('workers', 'jobs/types'), 'workers → jobs is allowed');
  t.ok(runsHostPrograms('domain/x.ts', "import { spawn } from 'node:child_process';"), 'child_process is caught');
  t.ok(runsHostPrograms('domain/x.ts', "import { run } from '../core/command';"), 'the host command runner is caught');
  t.notOk(runsHostPrograms('domain/x.ts', "import { now } from '../core/ids';"), 'an innocent import is not');
  t.ok(importsOf('server/host.ts').some((f) => f.startsWith('workers/')), 'real files are read (server/host.ts imports workers/)');
});
