/**
 * The boxd wire protocol, node side (docs/boxd.md; boxd/proto.go is the other side). Frames:
 * a one-byte type, a four-byte big-endian payload length, the payload. One exchange per
 * connection: the first frame names the request. Everything boxd sends is untrusted input:
 * lengths are bounded before anything is buffered, types and JSON shapes are checked.
 */

export const BOXD_PROTOCOL = 1;
/** The largest payload either side sends or accepts. */
export const MAX_FRAME = 1 << 20;
/** How many stdin bytes may be sent and not yet acknowledged by boxd (boxd/proto.go). */
export const STDIN_WINDOW = 1 << 20;
/** stdin travels in frames of at most this much, so that acknowledgements come often. */
export const STDIN_FRAME = 64 << 10;
const HEADER = 5;

export const Frame = {
  // requests (the first frame)
  exec: 'X',
  hello: 'V',
  shutdown: 'Q',
  stat: 'S',
  list: 'L',
  read: 'R',
  write: 'W',
  remove: 'D',
  mkdir: 'M',
  chmod: 'C',
  service: 'U',
  // node → boxd during an exec
  stdin: 'i',
  stdinEof: 'c',
  resize: 'r',
  signal: 'k',
  // boxd → node
  helloReply: 'v',
  started: 's',
  stdout: 'o',
  stderr: 'e',
  exit: 'x',
  error: 'f',
  ok: 'y',
  stdinAck: 'w',
  answer: 'a',
  data: 'd',
  end: 'z',
} as const;

/** Frames boxd may send. */
const FROM_BOXD = new Set<string>([Frame.helloReply, Frame.started, Frame.stdout, Frame.stderr, Frame.exit, Frame.error, Frame.ok, Frame.stdinAck, Frame.answer, Frame.data, Frame.end]);

export interface DecodedFrame {
  type: string;
  payload: Buffer;
}

/** boxd said something that is not the protocol. */
export class BoxdProtocolError extends Error {
  override name = 'BoxdProtocolError';
}

export function encodeFrame(type: string, payload: Buffer | string | object = Buffer.alloc(0)): Buffer {
  const body = Buffer.isBuffer(payload) ? payload : Buffer.from(typeof payload === 'string' ? payload : JSON.stringify(payload));
  if (body.length > MAX_FRAME) throw new RangeError(`frame of ${body.length} bytes passes ${MAX_FRAME}`);
  if (type.length !== 1) throw new RangeError(`bad frame type ${JSON.stringify(type)}`);
  const head = Buffer.alloc(HEADER);
  head.write(type, 0, 'latin1');
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

/** Splits what boxd sends into frames; throws BoxdProtocolError on a frame it may not send or
 *  a length past MAX_FRAME (before buffering it). */
export class FrameDecoder {
  /** What arrived and is not a whole frame yet, in the chunks it came in (joined only once a
   *  frame is complete: a 1 MiB frame in 64 KiB chunks is copied once, not 16 times). */
  private parts: Buffer[] = [];
  private size = 0;

  push(chunk: Buffer): DecodedFrame[] {
    this.parts.push(chunk);
    this.size += chunk.length;
    const out: DecodedFrame[] = [];
    while (this.size >= HEADER) {
      if (this.parts[0].length < HEADER) this.join();
      const head = this.parts[0];
      const type = String.fromCharCode(head[0]);
      if (!FROM_BOXD.has(type)) throw new BoxdProtocolError(`boxd sent an unknown frame type 0x${head[0].toString(16)}`);
      const len = head.readUInt32BE(1);
      if (len > MAX_FRAME) throw new BoxdProtocolError(`boxd sent a frame of ${len} bytes (at most ${MAX_FRAME})`);
      if (this.size < HEADER + len) break;
      if (this.parts[0].length < HEADER + len) this.join();
      const buf = this.parts[0];
      out.push({ type, payload: buf.subarray(HEADER, HEADER + len) });
      const rest = buf.subarray(HEADER + len);
      this.size -= HEADER + len;
      if (rest.length) this.parts[0] = rest;
      else this.parts.shift();
    }
    return out;
  }

  private join(): void {
    this.parts = [Buffer.concat(this.parts)];
  }

  /** Bytes of a frame begun but not complete. */
  get pending(): number {
    return this.size;
  }
}

/** The JSON of a frame, checked to be an object. */
export function frameJson(f: DecodedFrame): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(f.payload.toString('utf8'));
  } catch {
    throw new BoxdProtocolError(`boxd sent a '${f.type}' frame that is not JSON`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new BoxdProtocolError(`boxd sent a '${f.type}' frame that is not an object`);
  return v as Record<string, unknown>;
}

/** An integer field within [min, max], else BoxdProtocolError. */
export function intField(o: Record<string, unknown>, key: string, min: number, max: number, fallback?: number): number {
  const v = o[key] ?? fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw new BoxdProtocolError(`boxd sent ${key}=${JSON.stringify(o[key])}`);
  return v;
}

/** A short string field (boxd's messages are shown to users: bounded, no control bytes). */
export function textField(o: Record<string, unknown>, key: string, max = 500): string {
  const v = o[key];
  if (typeof v !== 'string') return '';
  return v.replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '').slice(0, max);
}

/** What an exec asks boxd for (ids are the box's own; env complete, `KEY=value`). */
export interface BoxdExecRequest {
  v: number;
  argv: string[];
  env: string[];
  cwd: string;
  uid: number;
  gid: number;
  groups: number[];
  tty: boolean;
  echo: boolean;
  cols: number;
  rows: number;
  stdin: boolean;
  detach: boolean;
  timeoutMs: number;
  /** A user to resolve in the box (NAME, NAME:GROUP, UID, UID:GID): replaces uid, gid, groups. */
  user?: string;
}

/** What boxd tells of a file (paths and ids are the box's own). */
export type { BoxFileInfo } from '../../drivers';
import type { BoxFileInfo } from '../../drivers';

/** A file answer, checked field by field. */
export function fileInfo(o: Record<string, unknown>): BoxFileInfo {
  const type = o.type;
  if (type !== 'file' && type !== 'dir' && type !== 'symlink' && type !== 'other') throw new BoxdProtocolError(`boxd sent file type ${JSON.stringify(type)}`);
  const info: BoxFileInfo = {
    name: textField(o, 'name', 4096),
    type,
    size: intField(o, 'size', 0, Number.MAX_SAFE_INTEGER),
    mode: intField(o, 'mode', 0, 0o7777),
    mtime: textField(o, 'mtime', 64),
    uid: intField(o, 'uid', 0, 2 ** 32 - 1),
    gid: intField(o, 'gid', 0, 2 ** 32 - 1),
  };
  if (type === 'symlink') info.target = textField(o, 'target', 4096);
  return info;
}
