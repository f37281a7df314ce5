/**
 * Listing at N boxes: every project (`GET /v1/projects/-/boxes`) and one project, each walked
 * page by page with the api's own page size and continuation token, LIST_REPS times (after a
 * warm-up); and `box ls --all-projects` (the CLI, one page) CLI_REPS times, with the CLI's own
 * start (`box --version`) beside it.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import type { Api, CallResult } from '../api';
import { summaryJson } from '../report';
import { nowMs, summarize } from '../stats';
import type { Created } from './create';
import { CLI_REPS, LIST_REPS } from './shape';

export type ListWalk = { ms: number; pageMs: number[]; boxes: { project: string; name: string }[] };

/** Every box the token sees, page by page with the api's own page size. */
export async function walkList(api: Api, project: string): Promise<ListWalk> {
  const boxes: { project: string; name: string }[] = [];
  const pageMs: number[] = [];
  let token: string | null = null;
  const t0 = nowMs();
  do {
    const p0 = nowMs();
    const res: CallResult = await api.call('GET', `/v1/projects/${project}/boxes${token ? `?continuation_token=${encodeURIComponent(token)}` : ''}`);
    pageMs.push(nowMs() - p0);
    if (res.status !== 200) throw new Error(`listing ${project} answered ${res.status}: ${res.text.slice(0, 300)}`);
    for (const b of res.body.boxes) boxes.push({ project: b.project, name: b.name });
    token = res.body.has_more ? res.body.next_continuation_token : null;
  } while (token);
  return { ms: nowMs() - t0, pageMs, boxes };
}

/** Boxes listed as running, every project. */
export async function countRunning(api: Api): Promise<number> {
  let n = 0;
  let token: string | null = null;
  do {
    const res: CallResult = await api.call('GET', `/v1/projects/-/boxes?max_results=1000${token ? `&continuation_token=${encodeURIComponent(token)}` : ''}`);
    if (res.status !== 200) throw new Error(`listing answered ${res.status}`);
    n += res.body.boxes.filter((b: any) => b.status === 'running').length;
    token = res.body.has_more ? res.body.next_continuation_token : null;
  } while (token);
  return n;
}

function runCli(args: string[], env: Record<string, string>): Promise<{ ms: number; code: number | null; out: string }> {
  // dist/bench/scale/list.js → dist/cli/main.js
  const main = path.resolve(__dirname, '..', '..', 'cli', 'main.js');
  return new Promise((resolve, reject) => {
    const t0 = nowMs();
    const child = spawn(process.execPath, [main, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (b: Buffer) => (out += b));
    child.stderr!.on('data', (b: Buffer) => (out += b));
    child.on('error', reject);
    child.on('close', (code) => resolve({ ms: nowMs() - t0, code, out }));
  });
}

/** The list figures, for results.json (`list`) and the report; a wrong count goes to `problems`. */
export async function measureLists(opts: {
  api: Api;
  /** The one project listed on its own. */
  project: string;
  created: Created[];
  problems: string[];
  progress: (msg: string) => void;
  checkpoint: () => void;
}) {
  const { api, project, created, problems, progress, checkpoint } = opts;
  progress(`scale: listing: every project and project ${project}, page by page, ${LIST_REPS} times each (after a warm-up)`);
  const all = await walkList(api, '-');
  // A create refused up front (503 after the retries) made no row; one that failed keeps its row.
  const made = created.filter((c) => c.opId !== null).length;
  if (all.boxes.length !== made) problems.push(`the list of every project had ${all.boxes.length} boxes, ${made} were made`);
  const one = await walkList(api, project);
  const allRuns: ListWalk[] = [];
  const oneRuns: ListWalk[] = [];
  for (let r = 0; r < LIST_REPS; r++) {
    checkpoint();
    allRuns.push(await walkList(api, '-'));
    oneRuns.push(await walkList(api, project));
  }
  const cliEnv = { BOXHOST_URL: api.url, BOXHOST_TOKEN: api.token };
  const cliRuns: number[] = [];
  let cliNote = '';
  await runCli(['ls', '--all-projects'], cliEnv);
  for (let r = 0; r < CLI_REPS; r++) {
    const c = await runCli(['ls', '--all-projects'], cliEnv);
    if (c.code !== 0) {
      cliNote = `box ls --all-projects exited ${c.code}: ${c.out.slice(0, 300)}`;
      break;
    }
    cliRuns.push(c.ms);
  }
  const cliVersion: number[] = [];
  for (let r = 0; r < CLI_REPS && !cliNote; r++) cliVersion.push((await runCli(['--version'], cliEnv)).ms);
  const json = {
    all_projects: { boxes: all.boxes.length, pages: all.pageMs.length, walk: summaryJson(summarize(allRuns.map((r) => r.ms))), page: summaryJson(summarize(allRuns.flatMap((r) => r.pageMs))) },
    one_project: { project, boxes: one.boxes.length, pages: one.pageMs.length, walk: summaryJson(summarize(oneRuns.map((r) => r.ms))), page: summaryJson(summarize(oneRuns.flatMap((r) => r.pageMs))) },
    cli_ls_all_projects: cliNote ? { error: cliNote } : { runs: summaryJson(summarize(cliRuns)), cli_start_only: summaryJson(summarize(cliVersion)) },
  };
  return { all, allRuns, oneRuns, cliRuns, cliVersion, cliNote, json };
}

export type ListFigures = Awaited<ReturnType<typeof measureLists>>;
