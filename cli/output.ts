import { Transform } from 'node:stream';
/** Everything `box` prints goes through here: JSON, tables, key/value views, progress, errors. */

export type Cell = string | number | boolean | null | undefined;

const out = (s: string) => process.stdout.write(s);
const err = (s: string) => process.stderr.write(s);

/** `--json`: the api's answer as is, pretty. */
export function printJson(value: unknown): void {
  if (value === undefined) return;
  out(`${JSON.stringify(value, null, 2)}\n`);
}

const cellText = (c: Cell) => (c === null || c === undefined || c === '' ? '-' : String(c));

/** A plain column-aligned table with a header row; `empty` is printed instead when there are no rows. */
export function printTable(headers: string[], rows: Cell[][], empty?: string): void {
  if (!rows.length && empty !== undefined) return say(empty);
  const text = rows.map((r) => r.map(cellText));
  const widths = headers.map((h, i) => Math.max(h.length, ...text.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]))).join('  ');
  out(`${[line(headers), ...text.map(line)].join('\n')}\n`);
}

/** A record as aligned `key: value` lines; undefined values are left out, null shows as `-`. */
export function printFields(fields: [string, Cell][]): void {
  const shown = fields.filter(([, v]) => v !== undefined);
  const width = Math.max(0, ...shown.map(([k]) => k.length)) + 1;
  out(`${shown.map(([k, v]) => `${`${k}:`.padEnd(width)} ${cellText(v)}`).join('\n')}\n`);
}

/** Prints a line on stdout (human output). */
export function say(line: string): void {
  out(`${line}\n`);
}

/** Prints a line on stderr (notes that are not the answer: hints, next-page tokens). */
export function note(line: string): void {
  err(`${line}\n`);
}

/** `{a: "1", b: "2"}` → `a=1,b=2`. */
export const formatMap = (m: Record<string, string> | null | undefined) =>
  m && Object.keys(m).length ? Object.entries(m).map(([k, v]) => `${k}=${v}`).join(',') : '';

export const formatList = (l: string[] | null | undefined) => (l && l.length ? l.join(',') : '');

/** RFC 3339 with milliseconds → `2026-11-22 04:06:27Z`, compact for tables. */
export const formatTime = (ts: string | null | undefined) => (ts ? ts.replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '');

/** A progress line on stderr: rewritten in place on a terminal, one line per change otherwise. */
export class Progress {
  private last = '';
  private readonly tty = Boolean(process.stderr.isTTY);

  update(text: string): void {
    if (text === this.last) return;
    this.last = text;
    if (this.tty) err(`\r\x1b[K${text}`);
    else err(`${text}\n`);
  }

  /** Ends the in-place line (with a final text when given). */
  done(text?: string): void {
    if (text !== undefined) this.update(text);
    if (this.tty && this.last) err('\n');
    this.last = '';
  }
}

export interface PrintableError {
  message: string;
  details?: { field: string; issue: string }[];
  hint?: string;
}

/** `error: <message>`, then each detail as `  <field>: <issue>`, then a hint. */
export function printError(e: PrintableError): void {
  const lines = [`error: ${e.message}`, ...(e.details ?? []).map((d) => `  ${d.field}: ${d.issue}`)];
  if (e.hint) lines.push(e.hint);
  err(`${lines.join('\n')}\n`);
}

/** A progress line on stderr for long transfers (only on a terminal, not with --json). */
export function transferProgress(label: string, total?: number): Transform {
  const show = process.stderr.isTTY;
  let done = 0;
  const t0 = Date.now();
  let last = 0;
  const line = (final = false) => {
    const s = (Date.now() - t0) / 1000;
    const mb = done / 1e6;
    const pct = total ? ` ${Math.min(100, Math.round((done / total) * 100))}%` : '';
    process.stderr.write(`\r${label}: ${mb.toFixed(1)} MB${total ? ` of ${(total / 1e6).toFixed(1)} MB` : ''}${pct}, ${(mb / Math.max(s, 0.001)).toFixed(1)} MB/s${final ? '\n' : ''}`);
  };
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      done += chunk.length;
      if (show && Date.now() - last > 200) {
        last = Date.now();
        line();
      }
      cb(null, chunk);
    },
    flush(cb) {
      if (show && Date.now() - t0 > 500) line(true);
      else if (show && last) process.stderr.write('\r\x1b[K');
      cb();
    },
  });
}

/** A byte count for people: `2.4 MiB`. */
export const formatBytes = (n: number) => (n >= 1 << 30 ? `${(n / (1 << 30)).toFixed(1)} GiB` : n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`);
