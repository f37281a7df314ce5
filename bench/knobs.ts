/** The bench's knobs (environment variables, read once), its project and its targets. */

export const PROJECT = 'bench';

const intEnv = (name: string, dflt: number) => {
  const v = Number(process.env[name]);
  return Number.isInteger(v) && v > 0 ? v : dflt;
};

export interface Knobs {
  creates: number;
  execs: number;
  forks: number;
  bigMb: number;
  /** Boxes of the scale figures (bench/scale.ts); 0 skips them. */
  scaleBoxes: number;
  /** Only the scale figures. */
  scaleOnly: boolean;
  /** Only the create figure (and the teardown): for measuring a change to create. */
  createOnly: boolean;
  /** Only the create and the interactive figures (WebSocket exec, files): a few minutes. */
  filesOnly: boolean;
  backupMb: number;
  backupRuns: number;
  /** WebSocket execs timed to their first byte, and the files' size and runs (issue 9). */
  wsExecs: number;
  fileMb: number;
  fileRuns: number;
  /** The publish proxy against the box's address (issue 10): seconds per run, runs, connections. */
  proxySecs: number;
  proxyRounds: number;
  proxyConns: number;
  /** A deploy under load through the proxy (issue 12): seconds of load (0 skips it). */
  deploySecs: number;
}

export function readKnobs(): Knobs {
  return {
    creates: intEnv('BENCH_CREATES', 20),
    execs: intEnv('BENCH_EXECS', 200),
    forks: intEnv('BENCH_FORKS', 5),
    bigMb: intEnv('BENCH_BIG_MB', 1024),
    scaleBoxes: (() => {
      const v = process.env.BENCH_SCALE_BOXES;
      const n = Number(v);
      return v !== undefined && v !== '' && Number.isInteger(n) && n >= 0 ? n : 1000;
    })(),
    scaleOnly: process.env.BENCH_SCALE_ONLY === '1',
    createOnly: process.env.BENCH_CREATE_ONLY === '1',
    filesOnly: process.env.BENCH_FILES_ONLY === '1',
    backupMb: intEnv('BENCH_BACKUP_MB', 256),
    backupRuns: intEnv('BENCH_BACKUP_RUNS', 3),
    wsExecs: intEnv('BENCH_WS_EXECS', 50),
    fileMb: intEnv('BENCH_FILE_MB', 256),
    fileRuns: intEnv('BENCH_FILE_RUNS', 5),
    proxySecs: intEnv('BENCH_PROXY_SECS', 5),
    proxyRounds: intEnv('BENCH_PROXY_ROUNDS', 2),
    proxyConns: intEnv('BENCH_PROXY_CONNECTIONS', 10),
    deploySecs: process.env.BENCH_DEPLOY_SECS === '0' ? 0 : intEnv('BENCH_DEPLOY_SECS', 10),
  };
}

/** exec: issue 8 (boxd) asks ≤ 0.3× raw `runc exec` (≈10 ms here); moonshot ≤ 5 ms. */
/** files: issue 9 asks the files API ≥ 0.5× raw cat's MB/s each way, i.e. ≤ 2× its time. */
// backup: at least 0.8x the MB/s of a raw `zfs send > file`, i.e. at most 1.25x its time.
export const TARGETS = { create: 1.5, exec: 0.3, fork: 1.2, files: 2, backup: 1.25 };
