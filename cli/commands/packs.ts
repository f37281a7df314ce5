import fs from 'node:fs';
import type { Command } from 'commander';
import YAML from 'yaml';
import type { BaseBuild, BaseBuildStart, BoxEvent, EventList, Pack, PackEvent, PackManifest, VerbResult } from '../../core/apiTypes';
import { OperationFailed, pollOperation } from '../jobs';
import { apiPath, UsageError } from '../client';
import { action, Ctx, int, keyValue, projectOption } from '../context';
import { formatTime, note, printFields, printTable, say } from '../output';

/** A manifest file: JSON, or YAML (the api takes both; the CLI sends JSON). */
function readManifest(file: string): PackManifest {
  const text = fs.readFileSync(file === '-' ? 0 : file, 'utf8');
  try {
    return JSON.parse(text) as PackManifest;
  } catch {
    try {
      return YAML.parse(text, { schema: 'core' }) as PackManifest;
    } catch (e) {
      throw new UsageError(`${file} is neither JSON nor YAML: ${(e as Error).message.split('\n')[0]}`);
    }
  }
}

const showPack = (p: Pack) => {
  printFields([
    ['name', p.name],
    ['description', p.description],
    ['rev', p.rev],
    ['default revision', `${p.default_rev} (${p.revisions[p.default_rev]?.rev ?? '?'})`],
    ['instances', p.instances],
    ['updated', formatTime(p.updated_at)],
  ]);
  printTable(['REVISION', 'HASH', 'BASE', 'PARENT', 'SERVICES', 'VERBS'], Object.entries(p.revisions).map(([label, r]) => [
    label, r.rev, r.base, r.parent, (r.services ?? []).map((s) => s.name).join(','), Object.keys(r.verbs ?? {}).join(','),
  ]));
};

const showEvents = (events: PackEvent[]) =>
  printTable(['TIME', 'PROJECT', 'BOX', 'PACK', 'VERB', 'WHO', 'OUTCOME', 'EXIT', 'MS', 'ID'], events.map((e) => [
    formatTime(e.ts), e.project, e.box_name, `${e.pack}@${e.rev}`, [e.verb, ...e.args].join(' '), e.who, e.outcome, e.exit_code ?? '', e.duration_ms, e.id,
  ]), 'no events');

/** `box pack …`, `box verb`, `box events` (docs/packs.md). */
export function register(program: Command): void {
  const pack = program.command('pack').description('packs: installable recipes for a kind of box (base, services, verbs, outputs)');
  pack.command('install <file>').description('install a manifest (JSON or YAML; - for stdin): box pack install web.yaml')
    .action(action(async (ctx, [file]) => ctx.show((await ctx.client.post<Pack>('/v1/packs', readManifest(file))).body, showPack)));
  pack.command('ls').description('list installed packs')
    .action(action(async (ctx) => {
      const { packs } = (await ctx.client.get<{ packs: Pack[] }>('/v1/packs')).body;
      ctx.show({ packs }, () => printTable(['NAME', 'REV', 'DEFAULT', 'REVISIONS', 'INSTANCES', 'DESCRIPTION'], packs.map((p) => [p.name, p.rev, p.default_rev, Object.keys(p.revisions).length, p.instances, p.description ?? '']), 'no packs installed'));
    }));
  pack.command('get <name>').description('one pack with its revisions')
    .action(action(async (ctx, [name]) => ctx.show((await ctx.client.get<Pack>(apiPath('v1', 'packs', name))).body, showPack)));
  pack.command('build <name>').description("build the base of a pack's default revision (POST /v1/base-builds with pack); --force builds it again")
    .option('-f, --force', 'build again even if that version exists')
    .option('--wait', 'wait for the build to end, showing progress')
    .action(action<{ force?: boolean; wait?: boolean }>(async (ctx, [name], o) => {
      const r = await ctx.client.request<BaseBuildStart>('POST', '/v1/base-builds', { body: { pack: name, force: Boolean(o.force) } });
      const started = r.body as BaseBuildStart;
      if (started.cached || !o.wait) return ctx.show(started, () => say(started.cached ? `the base of pack ${name} is built already (version ${started.version}); --force builds it again` : `build ${started.id}: ${started.status} (follow it with: box build logs ${started.id} -f)`));
      const label = { doing: 'building', done: 'built', what: `the base of pack ${name}` };
      const op = await pollOperation(ctx, String(r.headers['operation-id']), label);
      const build = (await ctx.client.get<BaseBuild>(`/v1/base-builds/${started.id}`)).body;
      if (op.status === 'failed') throw new OperationFailed({ ...op, error: build.error ?? op.error }, label);
      ctx.show(build, () => say(`built ${build.base}@${build.version} (build ${build.id})`));
    }));
  pack.command('rm <name>').description('delete a pack (refused while instances exist)')
    .action(action(async (ctx, [name]) => {
      await ctx.client.delete(apiPath('v1', 'packs', name));
      ctx.show({ deleted: name }, () => say(`pack ${name} deleted`));
    }));

  projectOption(program.command('verb <box> <verb> [args...]').description("run a pack instance's verb; records an event (box events)"))
    .option('--env <KEY=VALUE>', 'a variable the verb declares (repeatable)', keyValue)
    .action(action<{ project?: string; env?: Record<string, string> }>(async (ctx, [box, verb, args], o) => {
      // Never sent again: a run the api refused is still recorded as an event (box events).
      const { body } = await ctx.client.post<VerbResult>(`${apiPath('v1', 'projects', ctx.project(o.project), 'boxes', box, 'verbs', verb)}`, { args: args ?? [], env: o.env }, { retry: false });
      if (ctx.json) return ctx.show(body, () => undefined);
      process.stdout.write(body.stdout ?? '');
      process.stderr.write(body.stderr ?? '');
      ctx.exit(body.exit_code & 0xff);
    }));

  program.command('events').description('pack verb events, newest first')
    .option('-p, --project <project>', 'only this project')
    .option('--box <box>', 'only this box')
    .option('--pack <pack>', 'only this pack')
    .option('--verb <verb>', 'only this verb')
    .option('--outcome <outcome>', 'success, failure or error')
    .option('--since <time>', 'only events at or after this instant (RFC 3339)')
    .option('-n, --max <n>', 'at most this many (server default 100, at most 1000)', int(1, 1000))
    .option('--continuation-token <token>', 'the next (older) page, as told by the previous one')
    .option('-f, --follow', 'follow the event stream instead (verb runs and box lifecycle events as they happen; Ctrl-C ends it)')
    .action(action<{ project?: string; box?: string; pack?: string; verb?: string; outcome?: string; since?: string; max?: number; continuationToken?: string; follow?: boolean }>(async (ctx, _args, o) => {
      if (o.follow) return followStream(ctx, { project: o.project, box: o.box, pack: o.pack, verb: o.verb, outcome: o.outcome });
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries({ project: o.project, box: o.box, pack: o.pack, verb: o.verb, outcome: o.outcome, since: o.since, max_results: o.max, continuation_token: o.continuationToken })) if (v !== undefined) q.set(k, String(v));
      const page = (await ctx.client.get<EventList>(`/v1/events${q.size ? `?${q}` : ''}`)).body;
      ctx.show(page, () => showEvents(page.events));
      if (page.has_more && page.next_continuation_token) note(`more events: add --continuation-token ${page.next_continuation_token}`);
    }));
}

/**
 * `box events -f`: the SSE stream, one line per event (`--json`: one JSON object per line). A
 * stream that ends (the api's hour limit, a restart, a network blip) is opened again with
 * `Last-Event-ID`, so nothing is missed; a refusal (401, 404, 400) ends the command.
 */
async function followStream(ctx: Ctx, query: Record<string, string | undefined>): Promise<void> {
  let last: string | undefined;
  let connected = false;
  for (let failures = 0; ; ) {
    try {
      const res = await ctx.client.stream('GET', '/v1/events/stream', query, undefined, last ? { 'last-event-id': last } : {});
      connected = true;
      failures = 0;
      last = await readFrames(ctx, res, last);
    } catch (e) {
      const status = (e as { status?: number }).status;
      // The first connection failing is the user's to hear about; later ones are waited out.
      if (!connected || (status !== undefined && status < 500 && status !== 429)) throw e;
      failures++;
      if (!ctx.json) process.stderr.write(`the event stream broke off; reconnecting…\n`);
    }
    // Reconnect, a little later each time the api does not answer (at most every 10 s).
    await new Promise((r) => setTimeout(r, Math.min(500 * 2 ** failures, 10_000)));
  }
}

/** Prints each event of one stream; answers the id of the last one seen. */
async function readFrames(ctx: Ctx, res: NodeJS.ReadableStream & { setEncoding(e: string): void }, last: string | undefined): Promise<string | undefined> {
  res.setEncoding('utf8');
  let buf = '';
  for await (const chunk of res) {
    buf += chunk as string;
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const frame = buf.slice(0, at);
      buf = buf.slice(at + 2);
      let kind = 'message';
      let data = '';
      let id: string | undefined;
      for (const line of frame.split('\n')) {
        if (line.startsWith('event:')) kind = line.slice(6).trim();
        else if (line.startsWith('data:')) data += line.slice(5).trim();
        else if (line.startsWith('id:')) id = line.slice(3).trim();
      }
      if (id) last = id;
      if (!data) continue;
      const e = JSON.parse(data) as PackEvent & BoxEvent;
      if (ctx.json) process.stdout.write(`${JSON.stringify({ ...e, kind })}\n`);
      else if (kind === 'verb') say(`${formatTime(e.ts)}  ${e.project}/${e.box_name}  verb ${[e.verb, ...e.args].join(' ')}  ${e.outcome}${typeof e.exit_code === 'number' ? ` (exit ${e.exit_code})` : ''}  by ${e.who}  ${e.duration_ms} ms`);
      else say(`${formatTime(e.ts)}  ${e.project}/${e.box_name}  ${kind}  by ${e.who}${e.error ? `  ${e.error}` : ''}`);
    }
  }
  return last;
}
