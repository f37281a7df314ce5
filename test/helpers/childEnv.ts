/**
 * Children of a test start without tap's process-info hook. tap starts each test file with
 * NODE_OPTIONS holding `--import=<@tapjs/processinfo>`, and that hook puts itself into every
 * child the test spawns (a process-on-spawn listener rewrites the child's NODE_OPTIONS): each
 * Node child (a `box` CLI run, a worker or role process) then loads it before its own code,
 * 0.4 s more per child here (cli.test: 71 s with it, 43 s without). It serves coverage only:
 * with coverage off (`--disable-coverage`, as scripts/test.sh runs), this module, on import,
 * empties process-on-spawn's listener list (it keeps its state in a global under a well-known
 * symbol; tap's hook is its only user here) and drops the hook's entry from NODE_OPTIONS; any
 * other entry stays. Children so started print stack traces of dist/*.js, not of the sources.
 */
const SPAWN_HOOKS = Symbol.for('process-on-spawn@*:singletonId');

function dropTapHook(): void {
  if (process.env.TAP_DISABLE_COVERAGE !== '1') return;
  const hooks = (globalThis as Record<symbol, { listeners?: unknown[] } | undefined>)[SPAWN_HOOKS];
  if (hooks && Array.isArray(hooks.listeners)) hooks.listeners = [];
  const opts = process.env.NODE_OPTIONS;
  if (!opts) return;
  // Entries as Node reads them: quoted ones kept whole.
  const rest = (opts.match(/"(?:\\.|[^"\\])*"|\S+/g) ?? []).filter((o) => !/@tapjs[\\/]processinfo/.test(o)).join(' ');
  if (rest) process.env.NODE_OPTIONS = rest;
  else delete process.env.NODE_OPTIONS;
}

dropTapHook();
