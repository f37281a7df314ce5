/**
 * 2. exec `true` through the API (boxd forks it in the box) vs `runc exec <the same box's
 *    container> true`; the same exec through a second api process, which reaches the node
 *    through its agent (HTTP), as an api on another machine would.
 */
import { RUNC_BIN } from '../../workers/runtime/runc';
import { Api } from '../api';
import { CreateSample, execApi } from '../boxes';
import { TARGETS } from '../knobs';
import { RawRunner, spawnCollect } from '../raw';
import { figure, Figure, stepsJson, summaryJson } from '../report';
import { startRemoteApi } from '../setup';
import { fmtMs, summarize } from '../stats';
import type { SectionContext } from './context';

/** In `target` (a box of the create figure), against `raw`'s `runc exec` of its container. */
export async function execSection(ctx: SectionContext, target: CreateSample, raw: RawRunner): Promise<{ inProcess: Figure; viaAgent: Figure }> {
  const { api, host, config, runtime, knobs, profiler, figures, notes, results, resources, progress, checkpoint } = ctx;
  checkpoint();
  const ls = await spawnCollect([RUNC_BIN, '--root', runtime.root, 'list', '-q']);
  const cid = ls.stdout.split('\n').map((s) => s.trim()).find((id) => id.endsWith(`-${target.box.id}`));
  if (!cid) throw new Error(`no runc container for box ${target.name} (${target.box.id}) in ${runtime.root}: ${ls.stdout}`);
  const remote = await startRemoteApi(config);
  resources.remoteApi = remote.child;
  const viaAgent = new Api(remote.url, host.adminToken);
  progress(`exec: ${knobs.execs} × POST …/${target.name}/exec {command:["true"]} in-process and through a second api process + the node agent, interleaved with runc exec ${cid} true (after 5 warm-ups each)`);
  profiler.phase = 'exec-warmup';
  for (let i = 0; i < 5; i++) {
    checkpoint();
    await execApi(api, target.name, ['true']);
    await execApi(viaAgent, target.name, ['true']);
    await raw.exec(runtime.root, cid);
  }
  const execs: number[] = [];
  const remoteExecs: number[] = [];
  const rawExecs: number[] = [];
  // Each call starts after the same short pause, so whatever the call before it leaves
  // running (a reaped runc, a file removal) lands on none of them in particular.
  const settle = () => new Promise((r) => setTimeout(r, 15));
  for (let i = 0; i < knobs.execs; i++) {
    checkpoint();
    profiler.phase = 'exec';
    await settle();
    const r = await execApi(api, target.name, ['true']);
    if (r.body.exit_code !== 0) throw new Error(`exec true answered exit_code ${r.body.exit_code}: ${r.body.stderr}`);
    execs.push(r.ms);
    profiler.phase = 'exec-remote';
    await settle();
    const rr = await execApi(viaAgent, target.name, ['true']);
    if (rr.body.exit_code !== 0) throw new Error(`exec true through the agent answered exit_code ${rr.body.exit_code}: ${rr.body.stderr}`);
    remoteExecs.push(rr.ms);
    profiler.phase = 'exec-raw';
    await settle();
    rawExecs.push(await raw.exec(runtime.root, cid));
  }
  const inProcess = figure(`exec true (${knobs.execs} calls)`, execs, rawExecs, 'runc exec <box> true', TARGETS.exec);
  const agent = figure(`exec true via api process → node agent`, remoteExecs, rawExecs, 'runc exec <box> true', TARGETS.exec);
  figures.push(inProcess, agent);
  results.exec = {
    api: summaryJson(summarize(execs)),
    api_via_agent: summaryJson(summarize(remoteExecs)),
    raw: summaryJson(summarize(rawExecs)),
    api_steps: stepsJson(profiler, 'exec', knobs.execs),
  };
  notes.push(`exec p50 through the node agent is ${(summarize(remoteExecs).p50 - summarize(execs).p50).toFixed(1)} ms above in-process (${fmtMs(summarize(remoteExecs).p50)} vs ${fmtMs(summarize(execs).p50)} ms)`);
  progress(`exec done: api p50 ${fmtMs(inProcess.boxhost.p50)} ms, via agent ${fmtMs(agent.boxhost.p50)} ms, raw p50 ${fmtMs(inProcess.floor.p50)} ms`);
  return { inProcess, viaAgent: agent };
}
