#!/usr/bin/env node
import { Command, CommanderError, InvalidArgumentError } from 'commander';
import { ApiError, clientVersion, configPath, ConnectionError, UsageError } from './client';
import { printError } from './output';
import * as meta from './commands/meta';
import * as targets from './commands/targets';
import * as tokens from './commands/tokens';
import * as auth from './commands/auth';
import * as grants from './commands/grants';
import * as operations from './commands/operations';
import * as projects from './commands/projects';
import * as boxes from './commands/boxes';
import * as exec from './commands/exec';
import * as nodes from './commands/nodes';
import * as files from './commands/files';
import * as services from './commands/services';
import * as snapshots from './commands/snapshots';
import * as bases from './commands/bases';
import * as data from './commands/data';
import * as builds from './commands/builds';
import * as packs from './commands/packs';
import * as deploys from './commands/deploys';
import * as webhooks from './commands/webhooks';

const modules = [meta, tokens, auth, grants, operations, projects, boxes, exec, files, services, snapshots, bases, builds, data, packs, deploys, webhooks, nodes, targets];

const ENV_HELP = `
Where box connects (each flag > environment > target):
  --url / $BOXHOST_URL, --token / $BOXHOST_TOKEN, else the target (--target or the current one)
  in $BOXHOST_CONFIG, $XDG_CONFIG_HOME/boxhost/config.json or ~/.config/boxhost/config.json
  (now: ${configPath()}); with nothing set, http://127.0.0.1:8080.
  A target's token is only sent to that target's url.
Box commands use -p/--project, else $BOXHOST_PROJECT, else "default".
Exit codes: 0 success, 1 a failed call (the server's message on stderr), 2 a usage error;
  box exec exits with the command's exit code.`;

/** The whole `box` program; every command is one API call (the `target` commands make none). */
export function buildProgram(): Command {
  const program = new Command('box')
    .description(`client of the boxhost API (v${clientVersion()})`)
    // Settings inherited by every subcommand below: set before they are added.
    .exitOverride()
    .showHelpAfterError('(add --help for usage)')
    .configureHelp({ showGlobalOptions: true, sortSubcommands: false })
    .option('--target <name>', 'use this target of the config file instead of the current one')
    .option('--url <url>', 'base url of the api (overrides $BOXHOST_URL and the target)')
    .option('--token <token>', 'bearer token (overrides $BOXHOST_TOKEN and the target)')
    .option('--json', "print the API's JSON answer as is (pretty)")
    .addHelpText('after', ENV_HELP);
  for (const m of modules) m.register(program);
  return program;
}

/** Whether the command line asks for JSON (before a `--` that starts a command's own args). */
const jsonAsked = (argv: string[]) => {
  const end = argv.indexOf('--');
  return (end < 0 ? argv : argv.slice(0, end)).includes('--json');
};

/** Prints what went wrong and answers the exit code: 2 for usage errors, 1 for the rest. With
 *  --json, an error of the api (or of reaching it) is also printed on stdout as the api's error
 *  body, for a script that reads stdout: `{"error": {code, message, details}}`. */
export function reportError(e: unknown, argv: string[] = []): number {
  if (jsonAsked(argv) && (e instanceof ApiError || e instanceof ConnectionError)) {
    const error = e instanceof ApiError ? { code: e.code, message: e.message, details: e.details } : { code: 'unavailable', message: e.message, details: [] };
    process.stdout.write(`${JSON.stringify({ error }, null, 2)}\n`);
  }
  // An argument an action parsed itself (int(…)(value) in an action): commander never saw it.
  if (e instanceof InvalidArgumentError) {
    printError({ message: e.message, hint: '(add --help for usage)' });
    return 2;
  }
  if (e instanceof CommanderError) return e.exitCode === 0 ? 0 : 2; // commander printed it already
  if (e instanceof UsageError) {
    printError({ message: e.message, hint: '(add --help for usage)' });
    return 2;
  }
  if (e instanceof ApiError || e instanceof ConnectionError) {
    printError(e);
    return 1;
  }
  printError({ message: e instanceof Error ? e.message : String(e) });
  return 1;
}

export async function main(argv = process.argv): Promise<void> {
  // `box ls | head` closes the pipe early: that is not an error.
  process.stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE') process.exit(process.exitCode ?? 0);
    throw e;
  });
  try {
    await buildProgram().parseAsync(argv);
  } catch (e) {
    process.exitCode = reportError(e, argv);
  }
}

if (require.main === module) void main();
