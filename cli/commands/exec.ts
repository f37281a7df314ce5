import type { Command } from 'commander';
import { DEFAULT_EXEC_TIMEOUT_SECS, MAX_EXEC_TIMEOUT_SECS } from '../../core/box';
import type { ExecResult } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, int, keyValue, projectOption } from '../context';
import { note, say } from '../output';
import { attach, openSession, runDetachedFromStdin } from '../session';

/** The terminal's size, when it has one: a terminal that says 0×0 (script(1), some serial
 *  consoles and CI terminals) sends none, and the box's pty keeps its default 80×24. */
export function setTerminalSize(q: URLSearchParams): void {
  const { columns, rows, isTTY } = process.stdout;
  if (!isTTY || !(columns > 0) || !(rows > 0)) return;
  q.set('cols', String(columns));
  q.set('rows', String(rows));
}

interface ExecOptions {
  project?: string;
  interactive?: boolean;
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  tty?: boolean;
  shell?: boolean;
  /** false when --no-hup is given (commander's negated option). */
  hup: boolean;
  timeout?: number;
}

export function register(program: Command): void {
  registerExec(program);
  registerConsole(program);
}

function registerExec(program: Command): void {
  projectOption(
    program
      .command('exec <name> <command...>')
      .description('run a command in a running box, its output streamed (GET …/boxes/{name}/exec/ws; --json: POST …/exec); put -- before the command')
      .usage('[options] <name> -- <command> [args...]')
      .showHelpAfterError('(put -- before the command: box exec NAME -- COMMAND ARGS...)'),
  )
    .option('--cwd <dir>', 'working directory (absolute)')
    .option('--env <KEY=VALUE>', 'environment variable (repeatable)', keyValue)
    .option('--user <user>', 'run as this box-local user')
    .option('-i, --interactive', "attach this stdin to the command's (else it gets none)")
    .option('-t, --tty', 'allocate a pseudo-terminal (with -i: this terminal, raw, resized with the window)')
    .option('--shell', 'run the command words joined by spaces under /bin/sh -c')
    .option('--no-hup', 'start the command detached and return at once with its pid (with -i: it keeps running when box exits or the connection drops)')
    .option('--timeout <seconds>', 'kill the command after this many seconds (exit code 124; default 300, none with -i; at most 3600)', int(1, MAX_EXEC_TIMEOUT_SECS))
    .addHelpText(
      'after',
      "\nbox exits with the command's exit code. The output streams as it comes, byte for byte (box exec web -- tar c /srv > srv.tar);\nthe command's stdin is empty unless -i attaches this one. With --json the command runs to its end and the API's result\nis printed (its output as text, bytes that are not UTF-8 replaced).\nExamples: box exec web -- ls -la /\n          box exec -it web -- sh",
    )
    .action(
      action<ExecOptions>(async (ctx, [name, command], o) => {
        // Streamed over the WebSocket (GET …/exec/ws) unless the API's result is asked for
        // (--json) or the command is to run on detached without -i (its pid is the answer).
        if (o.interactive || (!ctx.json && o.hup !== false)) {
          const q = new URLSearchParams();
          for (const c of o.shell ? ['/bin/sh', '-c', command.join(' ')] : command) q.append('command', c);
          if (o.tty) q.set('tty', '1');
          if (o.cwd) q.set('cwd', o.cwd);
          if (o.user) q.set('user', o.user);
          for (const [k, v] of Object.entries(o.env ?? {})) q.append('env', `${k}=${v}`);
          if (o.hup === false) q.set('no_hup', '1');
          // A session has no timeout of its own; a plain exec keeps HTTP exec's default.
          const timeout = o.timeout ?? (o.interactive ? undefined : DEFAULT_EXEC_TIMEOUT_SECS);
          if (timeout) q.set('timeout_secs', String(timeout));
          if (o.tty) setTerminalSize(q);
          const session = await openSession(ctx.client, `${apiPath('v1', 'projects', ctx.project(o.project), 'boxes', name)}/exec/ws`, q);
          const code = o.interactive ? await attach(session, Boolean(o.tty)) : await runDetachedFromStdin(session, Boolean(o.tty));
          if (session.timedOut()) note(`box: the command was stopped after its timeout of ${timeout} s (--timeout to change it)`);
          ctx.exit(code & 0xff);
          return;
        }
        const { body } = await ctx.client.post<ExecResult>(`${apiPath('v1', 'projects', ctx.project(o.project), 'boxes', name)}/exec`, {
          command,
          cwd: o.cwd,
          env: o.env,
          user: o.user,
          tty: o.tty,
          shell: o.shell,
          no_hup: o.hup === false ? true : undefined,
          timeout_secs: o.timeout,
        });
        if (ctx.json) ctx.show(body, () => undefined);
        else say(`started detached process ${body.process}`);
        ctx.exit(body.detached || body.exit_code < 0 ? 0 : body.exit_code & 0xff);
      }),
    );
}

/** `box console NAME`: a login shell on a terminal in the box. */
export function registerConsole(program: Command): void {
  projectOption(program.command('console <name>').description('a login shell in a running box, on this terminal (GET …/boxes/{name}/console, WebSocket)'))
    .option('--user <user>', 'log in as this box-local user')
    .addHelpText('after', '\nExit the shell (exit, ^D) to come back; box exits with its exit code.')
    .action(
      action<{ project?: string; user?: string }>(async (ctx, [name], o) => {
        const q = new URLSearchParams();
        if (o.user) q.set('user', o.user);
        setTerminalSize(q);
        const session = await openSession(ctx.client, `${apiPath('v1', 'projects', ctx.project(o.project), 'boxes', name)}/console`, q);
        ctx.exit((await attach(session, true)) & 0xff);
      }),
    );
}
