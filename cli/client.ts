import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';

/** Where `box` talks to when nothing else is configured (the host's own default, DESIGN.md §1). */
export const DEFAULT_URL = 'http://127.0.0.1:8080';

// ---------------------------------------------------------------------------------------------
// Errors. main.ts maps them onto exit codes: UsageError → 2, everything else → 1.

/** The caller asked for something that cannot be sent (bad flags, unknown target): exit 2. */
export class UsageError extends Error {}

export interface ErrorDetail {
  field: string;
  issue: string;
}

/** A non-2xx answer of the api, carrying the server's `{"error": {code, message, details}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: ErrorDetail[] = [],
    /** A hint of the client's own, printed after the server's message. */
    readonly hint?: string,
    /** The answer's Retry-After header, as sent. */
    readonly retryAfter?: string,
  ) {
    super(message);
  }
}

/** The api could not be reached at all. */
export class ConnectionError extends Error {
  constructor(
    readonly endpoint: Endpoint,
    readonly reason: Error,
  ) {
    super(`cannot reach the boxhost api at ${endpoint.url} (${endpoint.source}): ${describeNetError(reason)}`);
  }

  get hint(): string {
    return 'hint: start the host, or point box at it: set BOXHOST_URL (and BOXHOST_TOKEN), pass --url/--token, or run `box target add NAME --url URL --token TOKEN`';
  }
}

function describeNetError(e: Error): string {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ECONNREFUSED') return 'connection refused';
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return 'unknown host';
  if (code === 'ECONNRESET') return 'connection reset';
  if (code === 'ETIMEDOUT') return 'timed out';
  return e.message || String(code);
}

// ---------------------------------------------------------------------------------------------
// Local configuration: named targets in ~/.config/boxhost/config.json.

export interface Target {
  url: string;
  token?: string;
}

export interface CliConfig {
  current?: string;
  targets: Record<string, Target>;
}

/** `$BOXHOST_CONFIG` (the file itself), else `$XDG_CONFIG_HOME/boxhost/config.json`, else `~/.config/…`. */
export function configPath(env: NodeJS.ProcessEnv = process.env): string {
  if (env.BOXHOST_CONFIG) return path.resolve(env.BOXHOST_CONFIG);
  const base = env.XDG_CONFIG_HOME || path.join(os.homedir(), '.config');
  return path.join(base, 'boxhost', 'config.json');
}

export function loadCliConfig(file = configPath()): CliConfig {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { targets: {} };
    throw e;
  }
  let parsed: any;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new UsageError(`${file} is not valid JSON: ${(e as Error).message}`);
  }
  const targets: Record<string, Target> = {};
  for (const [name, t] of Object.entries<any>(parsed?.targets ?? {})) {
    if (t && typeof t.url === 'string') targets[name] = { url: t.url, ...(typeof t.token === 'string' ? { token: t.token } : {}) };
  }
  return { current: typeof parsed?.current === 'string' ? parsed.current : undefined, targets };
}

/** Written with mode 0600: the file holds tokens. */
export function saveCliConfig(config: CliConfig, file = configPath()): void {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  fs.renameSync(tmp, file);
}

// ---------------------------------------------------------------------------------------------
// Which api, with which token: flag > environment > target > default.

export interface Endpoint {
  url: string;
  token?: string;
  /** Where the url came from, for messages ("--url", "BOXHOST_URL", "target local", "default"). */
  source: string;
}

export interface EndpointFlags {
  target?: string;
  url?: string;
  token?: string;
}

export function resolveEndpoint(flags: EndpointFlags, env: NodeJS.ProcessEnv = process.env, config?: CliConfig): Endpoint {
  const needsConfig = flags.target !== undefined || !(flags.url || env.BOXHOST_URL) || !(flags.token || env.BOXHOST_TOKEN);
  const cfg = config ?? (needsConfig ? loadCliConfig(configPath(env)) : { targets: {} });
  const targetName = flags.target ?? cfg.current;
  let target: Target | undefined;
  if (targetName !== undefined) {
    target = cfg.targets[targetName];
    if (!target && flags.target !== undefined) {
      const known = Object.keys(cfg.targets);
      throw new UsageError(`no target named ${flags.target} in ${configPath(env)}${known.length ? ` (known: ${known.join(', ')})` : ''}`);
    }
  }
  const pick = <T>(...c: [T | undefined, string][]) => c.find(([v]) => v !== undefined && v !== '') ?? [undefined, 'default'];
  const [url, source] = pick<string>([flags.url, '--url'], [env.BOXHOST_URL, 'BOXHOST_URL'], [target?.url, `target ${targetName}`]);
  // A target's token goes only to that target's url (or wherever --target was asked for), so a
  // BOXHOST_URL pointing elsewhere never receives the current target's token.
  const targetToken = url === undefined || url === target?.url || flags.target !== undefined ? target?.token : undefined;
  const [token] = pick<string>([flags.token, '--token'], [env.BOXHOST_TOKEN, 'BOXHOST_TOKEN'], [targetToken, `target ${targetName}`]);
  const finalUrl = (url ?? DEFAULT_URL).replace(/\/+$/, '');
  if (!/^https?:\/\/[^/]/.test(finalUrl)) throw new UsageError(`the api url ${finalUrl} (${source}) must start with http:// or https://`);
  return { url: finalUrl, token, source: url ? source : 'default' };
}

// ---------------------------------------------------------------------------------------------
// The HTTP client: one method per call, JSON in and out, typed errors.

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query;
  body?: unknown;
  /** Non-2xx statuses that are answers rather than errors (e.g. 503 of /healthz). */
  accept?: number[];
  /** False: a refusal is reported at once, never sent again (`retryAfterSecs`). */
  retry?: boolean;
}

export interface ApiResponse<T = any> {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The parsed JSON body; undefined when there is none (204). */
  body: T;
}

/** Encodes each path segment: `path('v1', 'projects', p)` → `/v1/projects/<p>`. */
export const apiPath = (...segments: string[]) => `/${segments.map((s) => encodeURIComponent(s)).join('/')}`;

/**
 * A call the api refused for now is sent again, as `curl --retry` or the Fly and LXD clients
 * do: a 429 whose Retry-After is at most RETRY_MAX_WAIT_S (a concurrency cap or the request rate,
 * 1–5 s; a project quota answers 60 s and is reported at once), any method, since every such
 * 429 is answered before anything is done; a 503 only for a GET or HEAD (a POST may have done
 * part of its work before the service behind it went), after its Retry-After (at most
 * RETRY_MAX_WAIT_S, else it is reported) or 1, 2, 4 s. `BOXHOST_RETRIES` times at most (3; 0
 * never), each said on stderr. A WebSocket session's handshake (exec, console) counts as a POST:
 * the api starts the process before it upgrades, so a 503 there may come after the start. Not
 * sent again: a verb (a refused run is recorded as an event), streamed calls (files).
 */
export const RETRY_MAX_WAIT_S = 10;

export interface RetryPolicy {
  retries: number;
  /** Where each retry is said (stderr). */
  say: (line: string) => void;
  sleep: (ms: number) => Promise<void>;
}

export function defaultRetryPolicy(env: NodeJS.ProcessEnv = process.env): RetryPolicy {
  const n = Number(env.BOXHOST_RETRIES);
  return {
    retries: env.BOXHOST_RETRIES !== undefined && env.BOXHOST_RETRIES !== '' && Number.isInteger(n) && n >= 0 ? n : 3,
    // On a terminal, over whatever progress line is there (it is drawn again at its next change).
    say: (line) => process.stderr.write(`${process.stderr.isTTY ? '\r\x1b[K' : ''}${line}\n`),
    sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  };
}

/** Seconds to wait before sending a refused call again, or null when it is not sent again. */
export function retryAfterSecs(method: string, status: number, header: string | undefined, attempt: number): number | null {
  const given = header !== undefined && /^\d+$/.test(header.trim()) ? Number(header.trim()) : null;
  // What the api asked for, if it is short enough to wait.
  const asked = given !== null && given <= RETRY_MAX_WAIT_S ? Math.max(given, 1) : null;
  if (status === 429) return asked;
  if (status === 503 && (method === 'GET' || method === 'HEAD')) return given === null ? Math.min(2 ** attempt, RETRY_MAX_WAIT_S) : asked;
  return null;
}

export class Client {
  constructor(
    readonly endpoint: Endpoint,
    private readonly retry: RetryPolicy = defaultRetryPolicy(),
  ) {}

  get<T = any>(p: string, opts?: RequestOptions) {
    return this.request<T>('GET', p, opts);
  }
  post<T = any>(p: string, body?: unknown, opts?: RequestOptions) {
    return this.request<T>('POST', p, { ...opts, body: body ?? {} });
  }
  put<T = any>(p: string, body: unknown, opts?: RequestOptions) {
    return this.request<T>('PUT', p, { ...opts, body });
  }
  delete<T = any>(p: string, opts?: RequestOptions) {
    return this.request<T>('DELETE', p, opts);
  }

  /**
   * node:http rather than fetch: fetch gives up on answers slower than 300 s (undici's headers
   * timeout), and exec or operation waits may legitimately take longer.
   */
  async request<T = any>(method: string, p: string, opts: RequestOptions = {}): Promise<ApiResponse<T>> {
    const url = new URL(this.endpoint.url + p);
    for (const [k, v] of Object.entries(opts.query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v));
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': `box-cli/${clientVersion()}` };
    if (this.endpoint.token) headers.authorization = `Bearer ${this.endpoint.token}`;
    let payload: Buffer | undefined;
    if (opts.body !== undefined) {
      payload = Buffer.from(JSON.stringify(opts.body));
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(payload.length);
    }
    const once = async () => {
      const res = await this.send(url, method, headers, payload);
      const body: any = res.text ? parseJson(res.text) : undefined;
      const ok = (res.status >= 200 && res.status < 300) || (opts.accept ?? []).includes(res.status);
      if (!ok) throw this.toError(res.status, res.statusMessage, body, res.text, res.headers['retry-after']);
      if (res.text && body === undefined) throw new ApiError(res.status, 'bad_response', `the api answered ${method} ${p} with something that is not JSON`);
      return { status: res.status, headers: res.headers, body };
    };
    return opts.retry === false ? once() : this.withRetry(method, once);
  }

  /** Runs `attempt` again while it throws a refusal for now (`retryAfterSecs`), at most the
   *  policy's retries, saying each; a call whose whole body is at hand (or that has none). */
  async withRetry<T>(method: string, attempt: () => Promise<T>): Promise<T> {
    for (let n = 0; ; n++) {
      try {
        return await attempt();
      } catch (e) {
        if (!(e instanceof ApiError)) throw e;
        const wait = n < this.retry.retries ? retryAfterSecs(method, e.status, e.retryAfter, n) : null;
        if (wait === null) throw e;
        this.retry.say(`box: ${e.message} (HTTP ${e.status}); trying again in ${wait} s (${n + 1} of ${this.retry.retries})`);
        await this.retry.sleep(wait * 1000);
      }
    }
  }

  /**
   * A streamed call: `body` (if any) piped up as raw bytes, the answer handed back as a stream
   * when it is a 2xx (the caller reads it), else thrown as the api's error.
   */
  stream(method: string, p: string, query: Query, body?: NodeJS.ReadableStream, extraHeaders: Record<string, string> = {}): Promise<http.IncomingMessage> {
    const url = new URL(this.endpoint.url + p);
    for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
    const headers: Record<string, string> = { 'user-agent': `box-cli/${clientVersion()}`, ...extraHeaders };
    if (this.endpoint.token) headers.authorization = `Bearer ${this.endpoint.token}`;
    if (body) headers['content-type'] = 'application/octet-stream';
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(url, { method, headers }, (res) => {
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) return resolve(res);
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          reject(this.toError(status, res.statusMessage ?? '', parseJson(text), text));
        });
      });
      req.on('error', (e) => reject(new ConnectionError(this.endpoint, e)));
      if (body) body.pipe(req);
      else req.end();
    });
  }

  private send(url: URL, method: string, headers: Record<string, string>, payload?: Buffer) {
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise<{ status: number; statusMessage: string; headers: http.IncomingHttpHeaders; text: string }>((resolve, reject) => {
      const req = mod.request(url, { method, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', (e) => reject(new ConnectionError(this.endpoint, e)));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, statusMessage: res.statusMessage ?? '', headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }),
        );
      });
      req.on('error', (e) => reject(new ConnectionError(this.endpoint, e)));
      req.end(payload);
    });
  }

  toError(status: number, statusMessage: string, body: any, text: string, retryAfter?: string | string[]): ApiError {
    const after = Array.isArray(retryAfter) ? retryAfter[0] : retryAfter;
    const err = body?.error;
    const hint =
      status === 401 && !this.endpoint.token
        ? 'hint: no token is set; pass --token, set BOXHOST_TOKEN, or run `box target add NAME --url URL --token TOKEN`'
        : undefined;
    if (err && typeof err.message === 'string') {
      const details = Array.isArray(err.details) ? err.details.filter((d: any) => d && typeof d.issue === 'string') : [];
      return new ApiError(status, String(err.code ?? 'unknown'), err.message, details, hint, after);
    }
    const snippet = text.trim().slice(0, 200);
    return new ApiError(status, 'unknown', `HTTP ${status} ${statusMessage}${snippet ? `: ${snippet}` : ''}`, [], hint, after);
  }
}

/** JSON, or undefined for text that is not. */
export function parseJson(text: string): any {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

let version: string | undefined;

/** The version of this client (the package it ships in). */
export function clientVersion(): string {
  if (version === undefined) {
    try {
      // dist/cli/client.js → package.json two levels up; cli/client.ts under ts-node likewise one.
      const candidates = [path.resolve(__dirname, '..', '..', 'package.json'), path.resolve(__dirname, '..', 'package.json')];
      const file = candidates.find((f) => fs.existsSync(f));
      version = file ? String(JSON.parse(fs.readFileSync(file, 'utf8')).version) : 'unknown';
    } catch {
      version = 'unknown';
    }
  }
  return version;
}
