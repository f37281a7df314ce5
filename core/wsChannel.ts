/**
 * The `boxhost.v1.channel` WebSocket framing of exec and console (DESIGN.md §4, docs/files.md
 * "Interactive"): every binary message starts with one channel byte. Shared by the api, the
 * node agent and the CLI.
 */
export const WS_SUBPROTOCOL = 'boxhost.v1.channel';

export const Channel = {
  stdin: 0,
  stdout: 1,
  stderr: 2,
  /** JSON `{"exit_code": n}` (and `error` when the session failed), then the socket closes. */
  status: 3,
  /** JSON `{"cols": n, "rows": n}` */
  resize: 4,
  /** JSON `{"signal": "TERM"}` (a name, with or without SIG) */
  signal: 5,
  /** `[255, 0]`: end of stdin (channel 0 closed) */
  close: 255,
} as const;

export function wsFrame(channel: number, payload: Buffer | string | object = Buffer.alloc(0)): Buffer {
  const body = Buffer.isBuffer(payload) ? payload : Buffer.from(typeof payload === 'string' ? payload : JSON.stringify(payload));
  return Buffer.concat([Buffer.from([channel]), body]);
}

export function parseWsFrame(data: Buffer | ArrayBuffer | Buffer[]): { channel: number; payload: Buffer } | null {
  const b = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
  if (b.length === 0) return null;
  return { channel: b[0], payload: b.subarray(1) };
}

/** A JSON payload as an object, or null. */
export function wsJson(payload: Buffer): Record<string, unknown> | null {
  try {
    const v = JSON.parse(payload.toString('utf8'));
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

const SIGNALS = ['HUP', 'INT', 'QUIT', 'KILL', 'USR1', 'USR2', 'TERM', 'CONT', 'STOP', 'TSTP', 'WINCH', 'ALRM'];

/** `TERM` or `SIGTERM` as a Node signal name; null for one the sessions do not pass on. */
export function signalName(s: unknown): NodeJS.Signals | null {
  if (typeof s !== 'string') return null;
  const n = s.toUpperCase().replace(/^SIG/, '');
  return SIGNALS.includes(n) ? (`SIG${n}` as NodeJS.Signals) : null;
}

/** The TCP socket under a `ws` 7 WebSocket (which has no pause of its own): paused, no more
 *  frames are read, and the peer's writes wait (back-pressure to the sender). */
export const rawSocket = (ws: object) => (ws as { _socket?: { pause(): void; resume(): void } })._socket;
