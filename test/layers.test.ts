import fs from 'node:fs';
import path from 'node:path';
import t from 'tap';

/**
 * The layers import only downward (docs/architecture.md "Layers"): core at the bottom, the api
 * never reaching a host driver, jobs and workers not importing each other both ways, the CLI
 * sharing only the API types. Read from the TypeScript sources, so a new import that breaks a
 * rule fails here before it ships.
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
  cli: ['cli', 'core/apiTypes', 'core/box'],
};

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(rel));
    else if (e.name.endsWith('.ts')) out.push(rel);
  }
  return out;
}

/** Every relative module a file imports (static imports, re-exports, require, import()). */
function importsOf(file: string): string[] {
  const text = fs.readFileSync(path.join(root, file), 'utf8');
  const specs = [...text.matchAll(/(?:from\s+|require\(\s*|import\(\s*|^import\s+)['"]([^'"]+)['"]/gm)].map((m) => m[1]);
  return specs.filter((s) => s.startsWith('.')).map((s) => path.normalize(path.join(path.dirname(file), s)));
}

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

t.test('the check catches a violation (positive control)', async (t) => {
  t.notOk(allowed('api', 'workers/runtime/runc'), 'api → workers is refused');
  t.notOk(allowed('core', 'db/knex'), 'core → db is refused');
  t.notOk(allowed('jobs', 'workers/boxSteps'), 'jobs → workers is refused');
  t.ok(allowed('workers', 'jobs/types'), 'workers → jobs is allowed');
  t.same(importsOf('server/host.ts').filter((f) => f.startsWith('workers/')).length > 0, true, 'imports are read (server/host.ts imports workers/)');
});
