import type { Command } from 'commander';
import { configPath, loadCliConfig, saveCliConfig, UsageError } from '../client';
import { action } from '../context';
import { printJson, printTable, say } from '../output';

/** Local configuration only: these commands make no API call. */
export function register(program: Command): void {
  const targets = program.command('target').description(`named api endpoints, kept in ${configPath().replace(process.env.HOME ?? '\0', '~')}`);

  targets
    .command('add <name>')
    .usage('<name> --url <url> [--token <token>] [--use]')
    .description('add (or replace) a target: --url (required) and --token are stored for it; the first one added becomes the current one')
    .option('--use', 'make it the current target')
    .action(
      action<{ use?: boolean }>(async (ctx, [name], o) => {
        // --url and --token are the program's own options (they are read whatever their place).
        const { url, token } = ctx.globals;
        if (!url) throw new UsageError('box target add needs --url <url>');
        if (!/^https?:\/\/[^/]/.test(url)) throw new UsageError(`--url ${url} must start with http:// or https://`);
        const cfg = loadCliConfig();
        cfg.targets[name] = { url: url.replace(/\/+$/, ''), ...(token ? { token } : {}) };
        if (o.use || !cfg.current || !cfg.targets[cfg.current]) cfg.current = name;
        saveCliConfig(cfg);
        if (!ctx.json) say(`target ${name} → ${cfg.targets[name].url}${cfg.current === name ? ' (current)' : ''}`);
      }),
    );

  targets
    .command('use <name>')
    .description('make a target the current one')
    .action(
      action(async (ctx, [name]) => {
        const cfg = loadCliConfig();
        if (!cfg.targets[name]) throw new UsageError(`no target named ${name} (see box target ls)`);
        cfg.current = name;
        saveCliConfig(cfg);
        if (!ctx.json) say(`current target: ${name} (${cfg.targets[name].url})`);
      }),
    );

  targets
    .command('rm <name>')
    .description('remove a target')
    .action(
      action(async (ctx, [name]) => {
        const cfg = loadCliConfig();
        if (!cfg.targets[name]) throw new UsageError(`no target named ${name} (see box target ls)`);
        delete cfg.targets[name];
        if (cfg.current === name) delete cfg.current;
        saveCliConfig(cfg);
        if (!ctx.json) say(`removed target ${name}`);
      }),
    );

  targets
    .command('ls')
    .description('list targets (tokens are not shown)')
    .action(
      action(async (ctx) => {
        const cfg = loadCliConfig();
        const rows = Object.entries(cfg.targets).map(([name, t]) => ({ name, url: t.url, current: name === cfg.current, has_token: Boolean(t.token) }));
        if (ctx.json) return printJson({ current: cfg.current ?? null, targets: rows });
        printTable(
          ['CURRENT', 'NAME', 'URL', 'TOKEN'],
          rows.map((r) => [r.current ? '*' : ' ', r.name, r.url, r.has_token ? 'set' : 'none']),
          'no targets yet: box target add NAME --url URL --token TOKEN',
        );
      }),
    );
}
