import type { Command } from 'commander';
import type { ExecResult } from '../../core/apiTypes';
import { apiPath } from '../client';
import { action, int, keyValue, projectOption } from '../context';
import { note, say } from '../output';

interface ExecOptions {
  project?: string;
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
  projectOption(
    program
      .command('exec <name> <command...>')
      .description('run a command in a running box (POST /v1/projects/{project}/boxes/{name}/exec); put -- before the command')
      .usage('[options] <name> -- <command> [args...]')
      .showHelpAfterError('(put -- before the command: box exec NAME -- COMMAND ARGS...)'),
  )
    .option('--cwd <dir>', 'working directory (absolute)')
    .option('--env <KEY=VALUE>', 'environment variable (repeatable)', keyValue)
    .option('--user <user>', 'run as this box-local user')
    .option('--tty', 'allocate a pseudo-terminal (its output arrives on stdout)')
    .option('--shell', 'run the command words joined by spaces under /bin/sh -c')
    .option('--no-hup', 'start the command detached and return at once with its pid')
    .option('--timeout <seconds>', 'kill the command after this many seconds (exit code 124; server default 300)', int(1))
    .addHelpText('after', '\nThe command\'s stdout and stderr are printed as they are, and box exits with its exit code.\nExample: box exec web -- ls -la /')
    .action(
      action<ExecOptions>(async (ctx, [name, command], o) => {
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
        else if (body.detached) say(`started detached process ${body.process}`);
        else {
          process.stdout.write(body.stdout ?? '');
          process.stderr.write(body.stderr ?? '');
          if (body.truncated) note('box: the output was truncated by the server');
        }
        ctx.exit(body.detached || body.exit_code < 0 ? 0 : body.exit_code & 0xff);
      }),
    );
}
