import { InvalidArgumentError, type Command } from 'commander';
import type { Publish, Service, ServiceStartRequest } from '../../core/apiTypes';
import { MAX_STOP_GRACE_SECS } from '../../core/box';
import { apiPath, UsageError } from '../client';
import { action, Ctx, defined, int, keyValue, list, projectOption } from '../context';
import { formatMap, printFields, printTable, say } from '../output';

/**
 * `box svc …` (services, docs/services.md) and `box publish / unpublish / open` (a box's
 * publishes). Every command is one route of the api.
 */

const boxPath = (ctx: Ctx, project: string | undefined, box: string) => apiPath('v1', 'projects', ctx.project(project), 'boxes', box);
const svcPath = (ctx: Ctx, project: string | undefined, box: string, svc?: string) => `${boxPath(ctx, project, box)}/services${svc ? `/${encodeURIComponent(svc)}` : ''}`;

/** `--env KEY=VALUE`, or `--env KEY` for KEY's value in this environment (how `commands.start`
 *  writes a secret: the line never holds it). */
function envEntry(value: string, previous: Record<string, string> | undefined): Record<string, string> {
  if (value.includes('=')) return keyValue(value, previous);
  const v = process.env[value];
  if (v === undefined) throw new InvalidArgumentError(`${value} is not set in this environment (--env ${value} takes its value from there)`);
  return { ...(previous ?? {}), [value]: v };
}

/** The options of a publish (box or service) and the body they make. */
const publishFlags = (cmd: Command, defaultName: string) =>
  cmd
    .option('--name <name>', `the publish name (default: ${defaultName})`)
    .option('--private', 'needs a bearer token')
    .option('--force', 'replace a publish of that name');
type PublishFlags = { project?: string; name?: string; private?: boolean; force?: boolean };
const publishBody = (o: PublishFlags) => defined({ name: o.name, public: o.private ? false : undefined, force: o.force }) ?? {};

const showPublish = (p: Publish) =>
  printFields([['name', p.name], ['url', p.url], ['port', p.port], ['public', p.public], ...(p.warning ? ([['warning', p.warning]] as [string, string][]) : [])]);

const showService = (s: Service) =>
  printFields([
    ['name', s.name],
    ['state', s.state],
    ...(s.error ? ([['error', s.error]] as [string, string][]) : []),
    ['pid', s.pid],
    ['restart', s.restart],
    ['restarts', s.restarts],
    ['last exit code', s.last_exit_code ?? ''],
    ['command', s.command.join(' ')],
    ['user', s.user],
    ['port', s.port || ''],
    ['url', s.url ?? ''],
    ['tags', formatMap(s.tags)],
    ['start', s.commands.start],
    ...(s.warning ? ([['warning', s.warning]] as [string, string][]) : []),
  ]);

interface StartOptions {
  project?: string;
  cwd?: string;
  env?: Record<string, string>;
  secretEnv?: string[];
  user?: string;
  restart?: string;
  port?: number;
  publish?: string;
  private?: boolean;
  readyHttp?: string;
  readyTcp?: number;
  readyPort?: number;
  readyStatus?: number;
  readyTimeout?: number;
  stopSignal?: string;
  stopGrace?: number;
  tag?: Record<string, string>;
}

function registerSvc(program: Command): void {
  const svc = program.command('svc').alias('service').description('long-lived services in a box, supervised inside it (restart policies, logs, ready gates, publishing)');

  projectOption(svc.command('start <box> <name> [command...]').description('start (or replace) a service: box svc start web www --port 8080 --publish www --ready-http / -- httpd -f -p 8080; without a command, start the stored one again'))
    .option('--cwd <dir>', 'working directory in the box (must exist)')
    .option('-e, --env <KEY=VALUE>', 'environment (repeatable); --env KEY takes KEY from this environment', envEntry)
    .option('--secret-env <KEY>', 'an env key whose value is secret: never shown in commands.start (repeatable)', list)
    .option('-u, --user <user>', 'run as this user of the box (name or uid[:gid])')
    .option('--restart <policy>', 'always (default), on-failure or never')
    .option('--port <port>', 'the port it listens on', int(0, 65535))
    .option('--publish <name>', 'also publish its port under this name (needs --port)')
    .option('--private', 'the publish needs a bearer token (public unless an auth provider is configured)')
    .option('--ready-http <path>', 'ready gate: GET this path inside the box until it answers (2xx or --ready-status)')
    .option('--ready-tcp <port>', 'ready gate: until this port accepts connections', int(1, 65535))
    .option('--ready-port <port>', 'the port of --ready-http (default: --port)', int(1, 65535))
    .option('--ready-status <code>', 'the status --ready-http wants (default: any 2xx)', int(100, 599))
    .option('--ready-timeout <secs>', 'how long the gate may take (default 30)', int(1, 600))
    .option('--stop-signal <signal>', 'how it is asked to stop (default TERM)')
    .option('--stop-grace <secs>', `before it is killed (default 10, at most ${MAX_STOP_GRACE_SECS})`, int(0, MAX_STOP_GRACE_SECS))
    .option('--tag <KEY=VALUE>', 'a tag (repeatable)', keyValue)
    .action(
      action<StartOptions>(async (ctx, [box, name, command], o) => {
        if (!command?.length) {
          // No command: the stored service, started again.
          const r = await ctx.client.request<Service>('POST', `${svcPath(ctx, o.project, box, name)}/start`, { body: {} });
          return ctx.show(r.body, (s) => say(`service ${s.name} is ${s.state}${s.pid ? ` (pid ${s.pid})` : ''}`));
        }
        const ready = defined({ http: o.readyHttp, tcp: o.readyTcp, port: o.readyPort, status: o.readyStatus, timeout_secs: o.readyTimeout });
        const body: ServiceStartRequest = {
          name,
          command,
          ...defined({ cwd: o.cwd, env: o.env, secret_env: o.secretEnv, user: o.user, port: o.port, tags: o.tag }),
          ...(o.restart ? { restart: o.restart as ServiceStartRequest['restart'] } : {}),
          ...(o.publish ? { publish: { name: o.publish, ...(o.private ? { public: false } : {}) } } : {}),
          ...(ready ? { ready } : {}),
          ...(o.stopSignal || o.stopGrace !== undefined ? { stop: defined({ signal: o.stopSignal, grace_secs: o.stopGrace }) } : {}),
        };
        if (ready && !ctx.json) process.stderr.write(`starting service ${name} and waiting for its ready gate…\n`);
        const r = await ctx.client.request<Service>('POST', svcPath(ctx, o.project, box), { body });
        ctx.show(r.body, (s) => {
          say(`${r.status === 201 ? 'started' : 'replaced'} service ${s.name} (${s.state}${s.pid ? `, pid ${s.pid}` : ''})${s.url ? `: ${s.url}` : ''}`);
          if (s.warning) process.stderr.write(`warning: ${s.warning}\n`);
        });
      }),
    );

  projectOption(svc.command('ls <box>').description("a box's services")).action(
    action<{ project?: string }>(async (ctx, [box], o) => {
      const r = await ctx.client.request<{ services: Service[] }>('GET', svcPath(ctx, o.project, box));
      ctx.show(r.body, (b) =>
        printTable(['NAME', 'STATE', 'PID', 'RESTARTS', 'PORT', 'URL', 'COMMAND'], b.services.map((s) => [s.name, s.state, s.pid || '', s.restarts, s.port || '', s.url ?? '', s.error ? `(${s.error})` : s.command.join(' ')]), 'no services'),
      );
    }),
  );

  projectOption(svc.command('get <box> <name>').description('one service')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => ctx.show((await ctx.client.request<Service>('GET', svcPath(ctx, o.project, box, name))).body, showService)),
  );

  projectOption(svc.command('stop <box> <name>').description('stop it (its signal, then SIGKILL after the grace); it stays stopped until started'))
    .option('--signal <signal>', 'instead of its own stop signal')
    .option('--grace <secs>', `instead of its own grace (at most ${MAX_STOP_GRACE_SECS})`, int(0, MAX_STOP_GRACE_SECS))
    .action(
      action<{ project?: string; signal?: string; grace?: number }>(async (ctx, [box, name], o) => {
        const r = await ctx.client.request<Service>('POST', `${svcPath(ctx, o.project, box, name)}/stop`, { body: defined({ signal: o.signal, grace_secs: o.grace }) ?? {} });
        ctx.show(r.body, (s) => say(`service ${s.name} is ${s.state}`));
      }),
    );

  projectOption(svc.command('restart <box> <name>').description('restart a service (its stop, then start)')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      const r = await ctx.client.request<Service>('POST', `${svcPath(ctx, o.project, box, name)}/restart`, { body: {} });
      ctx.show(r.body, (s) => say(`service ${s.name} is ${s.state}${s.pid ? ` (pid ${s.pid})` : ''}`));
    }),
  );

  projectOption(svc.command('rm <box> <name>').description('stop a service and remove it (spec, logs, publish)')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      await ctx.client.request('DELETE', svcPath(ctx, o.project, box, name));
      if (!ctx.json) say(`removed service ${name}`);
    }),
  );

  projectOption(svc.command('logs <box> <name>').description("a service's output"))
    .option('-n, --tail <lines>', 'only the last N lines', int(0, 10000))
    .option('-f, --follow', 'keep printing what it writes')
    .action(
      action<{ project?: string; tail?: number; follow?: boolean }>(async (ctx, [box, name], o) => {
        const res = await ctx.client.stream('GET', `${svcPath(ctx, o.project, box, name)}/logs`, { tail: o.tail, follow: o.follow ? 'true' : undefined });
        process.once('SIGINT', () => res.destroy());
        for await (const c of res) process.stdout.write(c as Buffer);
      }),
    );

  publishFlags(projectOption(svc.command('publish <box> <name>').description("publish a service's port as a URL")), 'the service name')
    .action(
      action<PublishFlags>(async (ctx, [box, name], o) => {
        const r = await ctx.client.request<Publish>('POST', `${svcPath(ctx, o.project, box, name)}/publish`, { body: publishBody(o) });
        ctx.show(r.body, showPublish);
      }),
    );

  projectOption(svc.command('unpublish <box> <name>').description("remove a service's publish")).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      await ctx.client.request('DELETE', `${svcPath(ctx, o.project, box, name)}/publish`);
      if (!ctx.json) say(`unpublished service ${name}`);
    }),
  );
}

export function register(program: Command): void {
  registerSvc(program);

  publishFlags(projectOption(program.command('publish <box> <port>').description('publish a port of a box as a URL: box publish web 8080 --name site')), 'p<port>')
    .action(
      action<PublishFlags>(async (ctx, [box, port], o) => {
        const r = await ctx.client.request<Publish>('POST', `${boxPath(ctx, o.project, box)}/publish`, { body: { port: portArg(port), ...publishBody(o) } });
        ctx.show(r.body, showPublish);
      }),
    );

  projectOption(program.command('unpublish <box> <name>').description('remove a publish of a box')).action(
    action<{ project?: string }>(async (ctx, [box, name], o) => {
      await ctx.client.request('DELETE', `${boxPath(ctx, o.project, box)}/publish/${encodeURIComponent(name)}`);
      if (!ctx.json) say(`unpublished ${name}`);
    }),
  );

  projectOption(program.command('open <box> [publish]').description("print a box's published URL (the only one, or the named one)")).action(
    action<{ project?: string }>(async (ctx, [box, publish], o) => {
      const b = (await ctx.client.request<{ publishes: Publish[] | null }>('GET', boxPath(ctx, o.project, box))).body;
      const all = b.publishes ?? [];
      const pick = publish ? all.find((p) => p.name === publish) : all.length === 1 ? all[0] : undefined;
      if (!pick) {
        // Nothing to open is a lookup that failed (exit 1); several to choose from, a usage error (2).
        if (!all.length) throw new Error(`box ${box} publishes nothing: box publish ${box} <port>`);
        if (publish) throw new Error(`box ${box} has no publish ${publish} (it has ${all.map((p) => p.name).join(', ')})`);
        throw new UsageError(`box ${box} has several publishes: name one of ${all.map((p) => p.name).join(', ')}`);
      }
      ctx.show(pick, (p) => say(p.url));
    }),
  );
}

/** The PORT argument of `box publish` (commander parses options, not this argument). */
function portArg(port: string): number {
  try {
    return int(1, 65535)(port);
  } catch (e) {
    throw new UsageError(`port ${JSON.stringify(port)} ${(e as Error).message}`);
  }
}
