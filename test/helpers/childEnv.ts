/**
 * Children of a test start without tap's process-info hook. tap starts each test file with
 * NODE_OPTIONS holding `--import=<@tapjs/processinfo>`, and that hook puts itself into every
 * child the test spawns (a process-on-spawn listener rewrites the child's NODE_OPTIONS): each
 * Node child (a `box` CLI run, a worker or role process) then loads it before its own code,
 * 0.4 s more per child here (cli.test: 71 s with it, 43 s without). It serves coverage only:
 * with coverage off (`--disable-coverage`, as scripts/test.sh runs), this module removes the
 * listener (process-on-spawn keeps its state in a global under a well-known symbol) and the
 * hook's entry in NODE_OPTIONS, on import. Any other NODE_OPTIONS stay.
 */
const SPAWN_HOOKS = Symbol.for('process-on-spawn@*:singletonId');

export function dropTapHook(env: NodeJS.ProcessEnv = process.env): void {
  if (env.TAP_DISABLE_COVERAGE !== '1') return;
  const hooks = (globalThis as Record<symbol, { listeners?: unknown[] } | undefined>)[SPAWN_HOOKS];
  if (hooks && Array.isArray(hooks.listeners)) hooks.listeners = [];
  const opts = env.NODE_OPTIONS;
  if (!opts) return;
  const rest = opts
    .split(/\s+/)
    .filter((o) => o && !/@tapjs[\\/]processinfo/.test(o))
    .join(' ');
  if (rest) env.NODE_OPTIONS = rest;
  else delete env.NODE_OPTIONS;
}

dropTapHook();
