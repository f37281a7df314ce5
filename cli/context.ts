import fs from 'node:fs';
import { Command, InvalidArgumentError } from 'commander';
import { Client, resolveEndpoint, UsageError } from './client';
import { printJson } from './output';

/** Options of the program itself, valid before or after any subcommand. */
export interface GlobalOptions {
  target?: string;
  url?: string;
  token?: string;
  json?: boolean;
}

/** What a command handler gets besides its own arguments. */
export class Ctx {
  private cached?: Client;

  constructor(readonly globals: GlobalOptions) {}

  /** The api client, resolved on first use (so commands that make no call never need one). */
  get client(): Client {
    return (this.cached ??= new Client(resolveEndpoint(this.globals)));
  }

  get json(): boolean {
    return Boolean(this.globals.json);
  }

  /** `-p` when given, else `$BOXHOST_PROJECT`, else `default`. */
  project(flag?: string): string {
    return flag || process.env.BOXHOST_PROJECT || 'default';
  }

  /** With `--json` the api's answer as is; otherwise the human view of it. */
  show<T>(body: T, human: (body: T) => void): void {
    if (this.json) printJson(body);
    else human(body);
  }

  /** Sets the exit code without cutting output short (process.exit would). */
  exit(code: number): void {
    process.exitCode = code;
  }
}

/**
 * Wraps a handler for commander: `fn(ctx, positionalArgs, commandOptions)`. Every command goes
 * through here, so global options and error handling live in one place (main.ts).
 */
export function action<O = Record<string, any>>(fn: (ctx: Ctx, args: any[], opts: O) => Promise<void>) {
  return async (...a: any[]) => {
    const cmd = a[a.length - 1] as Command;
    const opts = a[a.length - 2] as O;
    await fn(new Ctx(cmd.optsWithGlobals<GlobalOptions>()), a.slice(0, -2), opts);
  };
}

// ---------------------------------------------------------------------------------------------
// Option value parsers (commander reports their failures as usage errors: exit 2).

/** An integer within [min, max]. */
export const int =
  (min = 0, max = Number.MAX_SAFE_INTEGER) =>
  (value: string): number => {
    if (!/^-?\d+$/.test(value.trim())) throw new InvalidArgumentError('must be an integer');
    const n = Number(value);
    if (n < min || n > max) throw new InvalidArgumentError(`must be between ${min} and ${max}`);
    return n;
  };

/** `true|false` (also yes/no, 1/0, on/off). */
export function bool(value: string): boolean {
  const v = value.trim().toLowerCase();
  if (['true', 'yes', '1', 'on'].includes(v)) return true;
  if (['false', 'no', '0', 'off'].includes(v)) return false;
  throw new InvalidArgumentError('must be true or false');
}

/** A repeatable option whose values may also be comma-separated: `--repo a/b --repo c/d,e/f`. */
export function list(value: string, previous: string[] | undefined): string[] {
  const items = value.split(',').map((s) => s.trim()).filter(Boolean);
  if (!items.length) throw new InvalidArgumentError('must not be empty');
  return [...(previous ?? []), ...items];
}

/** A repeatable `KEY=VALUE` option collected into a map (the value may contain `=` and `,`). */
export function keyValue(value: string, previous: Record<string, string> | undefined): Record<string, string> {
  const i = value.indexOf('=');
  if (i <= 0) throw new InvalidArgumentError('must be KEY=VALUE');
  return { ...(previous ?? {}), [value.slice(0, i)]: value.slice(i + 1) };
}

/** Object without its undefined fields, or undefined when nothing is left. */
export function defined<T extends Record<string, unknown>>(o: T): Partial<T> | undefined {
  const out = Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
  return Object.keys(out).length ? out : undefined;
}

/** The project option every box command takes. */
export const projectOption = (cmd: Command) => cmd.option('-p, --project <project>', 'project (default: $BOXHOST_PROJECT or "default")');

/** A local path's stat, or an error naming the path in plain words (not the fs error's text). */
export function localStat(file: string): fs.Stats {
  try {
    return fs.statSync(file);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new UsageError(code === 'ENOENT' ? `no such local file or directory: ${file}` : `cannot read ${file} (${code})`);
  }
}
