import type { Publish, ServiceStartRequest } from '../core/apiTypes';
import { MAX_STOP_GRACE_SECS } from '../core/box';
import type { BoxRecord } from '../db/repos/boxes';

/**
 * A Service's `commands` (spec "Service"): `box` command lines that reproduce it. A value of a
 * `secret_env` key is never written: `--env KEY` without `=` makes the CLI take KEY's value from
 * its own environment, so the line re-runs as it is where that variable is set.
 */

/** POSIX shell quoting: bare when safe, else single quotes. */
export function shellQuote(s: string): string {
  if (/^[A-Za-z0-9_/.:=@%+,-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

export function serviceCommands(box: BoxRecord, spec: ServiceStartRequest, publish?: Publish): { start: string; publish: string; unpublish: string } {
  const at = [box.name, spec.name, '-p', box.project];
  const a: string[] = ['box', 'svc', 'start', ...at];
  const flag = (name: string, v: string | number | undefined) => {
    if (v !== undefined && v !== '') a.push(name, String(v));
  };
  flag('--cwd', spec.cwd);
  flag('--user', spec.user);
  if (spec.restart && spec.restart !== 'always') flag('--restart', spec.restart);
  if (spec.port) flag('--port', spec.port);
  const secret = new Set(spec.secret_env ?? []);
  for (const [k, v] of Object.entries(spec.env ?? {}).sort(([x], [y]) => x.localeCompare(y))) a.push('--env', secret.has(k) ? k : `${k}=${v}`);
  for (const k of [...secret].sort()) a.push('--secret-env', k);
  if (spec.publish) {
    flag('--publish', spec.publish.name ?? spec.name);
    if (spec.publish.public === false) a.push('--private');
  }
  const r = spec.ready;
  if (r) {
    flag('--ready-http', r.http);
    flag('--ready-tcp', r.tcp);
    flag('--ready-port', r.port);
    flag('--ready-status', r.status);
    flag('--ready-timeout', r.timeout_secs);
  }
  flag('--stop-signal', spec.stop?.signal);
  // A spec stored before the cap may hold more than the CLI takes now: the command stays runnable.
  flag('--stop-grace', spec.stop?.grace_secs === undefined ? undefined : Math.min(spec.stop.grace_secs, MAX_STOP_GRACE_SECS));
  for (const [k, v] of Object.entries(spec.tags ?? {}).sort(([x], [y]) => x.localeCompare(y))) a.push('--tag', `${k}=${v}`);
  a.push('--', ...spec.command);
  const pub = ['box', 'svc', 'publish', ...at];
  if (publish) {
    pub.push('--name', publish.name);
    if (!publish.public || publish.warning) pub.push('--private');
    pub.push('--force');
  }
  return {
    start: a.map(shellQuote).join(' '),
    publish: pub.map(shellQuote).join(' '),
    unpublish: ['box', 'svc', 'unpublish', ...at].map(shellQuote).join(' '),
  };
}
