/**
 * boxhost soak: rounds of hundreds of box lifecycles on one real host in this process (see
 * soak.ts for what a round does and checks). Exits 0 when every check passed, 1 otherwise (or
 * when the soak could not run), 130 when interrupted. Everything it made is removed at the end.
 *
 *   npm run soak        (or: npx tsc -p . && node dist/soak/main.js)
 *
 * Knobs (environment): SOAK_ROUNDS (3), SOAK_BOXES (200 per round), SOAK_CREATE_CONCURRENCY
 * (10), SOAK_WORK_CONCURRENCY (10: box scripts of execs, forks, stops, resumes at once),
 * SOAK_DELETE_CONCURRENCY (20), SOAK_PROJECTS (2), SOAK_KEEPERS (3), SOAK_FORK_EVERY (10),
 * SOAK_STOP_EVERY (5), SOAK_DURATION_S (0: no limit; no new round, and no new box, after it),
 * SOAK_OP_BOUND_S (300: an operation unfinished this long is stuck), SOAK_SEED (random),
 * SOAK_RESULTS (the JSON result file; default a new file under /var/tmp).
 */
import '../server/threadpool'; // first: before libuv's thread pool starts
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_OPTIONS, runSoak, SoakOptions } from './soak';
import { formatSummary } from './report';

const intEnv = (name: string, dflt: number, min = 1) => {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return dflt;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < min) {
    process.stderr.write(`${name}=${raw}: must be an integer ≥ ${min}\n`);
    process.exit(2);
  }
  return v;
};

const progress = (msg: string) => process.stderr.write(`[soak ${new Date().toISOString().slice(11, 23)}] ${msg}\n`);

async function main(): Promise<number> {
  let interrupted = false;
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.on(sig, () => {
      if (interrupted) return progress(`${sig}: already stopping (deleting what the soak made, then checking)`);
      interrupted = true;
      progress(`${sig}: no new boxes; deleting what the soak made, then cleaning up`);
    });
  }
  const d = DEFAULT_OPTIONS;
  const opts: SoakOptions = {
    rounds: intEnv('SOAK_ROUNDS', d.rounds),
    boxesPerRound: intEnv('SOAK_BOXES', d.boxesPerRound),
    createConcurrency: intEnv('SOAK_CREATE_CONCURRENCY', d.createConcurrency),
    workConcurrency: intEnv('SOAK_WORK_CONCURRENCY', d.workConcurrency),
    deleteConcurrency: intEnv('SOAK_DELETE_CONCURRENCY', d.deleteConcurrency),
    projects: intEnv('SOAK_PROJECTS', d.projects),
    keepers: intEnv('SOAK_KEEPERS', d.keepers, 0),
    forkEvery: intEnv('SOAK_FORK_EVERY', d.forkEvery, 0),
    stopEvery: intEnv('SOAK_STOP_EVERY', d.stopEvery, 0),
    durationLimitS: intEnv('SOAK_DURATION_S', d.durationLimitS, 0),
    opBoundS: intEnv('SOAK_OP_BOUND_S', d.opBoundS),
    seed: intEnv('SOAK_SEED', Math.floor(Math.random() * 2 ** 31), 0),
    progress,
    interrupted: () => interrupted,
  };
  const result = await runSoak(opts);
  let file = process.env.SOAK_RESULTS;
  if (!file) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir() === '/tmp' ? '/var/tmp' : os.tmpdir(), 'boxhost-soak-'));
    file = path.join(dir, 'results.json');
  }
  fs.writeFileSync(file, JSON.stringify(result, null, 2));
  process.stdout.write(`${formatSummary(result, file)}\n`);
  process.stdout.write(`${JSON.stringify({ results: file, passed: result.failures.length === 0, failures: result.failures.length, duration_s: result.duration_s, rounds: result.rounds.length })}\n`);
  if (result.interrupted) return 130;
  return result.failures.length === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`soak crashed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
