/**
 * The boxd wire protocol, node side (docs/boxd.md; boxd/proto.go is the other side). Frames:
 * a one-byte type, a four-byte big-endian payload length, the payload. One exchange per
 * connection: the first frame names the request. Everything boxd sends is untrusted input:
 * lengths are bounded before anything is buffered, types and JSON shapes are checked.
 */

import type { Writable } from 'node:stream';

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

/** A frame's header for a payload of `length` bytes (type and length checked). */
function frameHead(type: string, length: number): Buffer {
  if (length > MAX_FRAME) throw new RangeError(`frame of ${length} bytes passes ${MAX_FRAME}`);
  if (type.length !== 1) throw new RangeError(`bad frame type ${JSON.stringify(type)}`);
  const head = Buffer.allocUnsafe(HEADER);
  head.write(type, 0, 'latin1');
  head.writeUInt32BE(length, 1);
  return head;
}

export function encodeFrame(type: string, payload: Buffer | string | object = Buffer.alloc(0)): Buffer {
  const body = Buffer.isBuffer(payload) ? payload : Buffer.from(typeof payload === 'string' ? payload : JSON.stringify(payload));
  return Buffer.concat([frameHead(type, body.length), body]);
}

/**
 * Writes one frame without copying its payload: header and payload go out in one writev with
 * the other frames written in the same tick (the socket is corked until the next one).
 */
export function writeFrame(sock: Writable, type: string, payload: Buffer): boolean {
  const head = frameHead(type, payload.length);
  sock.cork();
  sock.write(head);
  const ok = sock.write(payload);
  process.nextTick(() => sock.uncork());
  return ok;
}

/** Splits what boxd sends into frames; throws BoxdProtocolError on a frame it may not send or
 *  a length past MAX_FRAME (before buffering it). */
export class FrameDecoder {
  /** What arrived and is not a whole frame yet, in the chunks it came in (joined only once a
   *  frame is complete: a 1 MiB frame in 64 KiB chunks is copied once, not 16 times). */
  private parts: Buffer[] = [];
  private size = 0;
  /** Frame types whose payload is a byte stream: handed on in pieces as they arrive, never
   *  joined (a file read moves no byte twice in the node). */
  private readonly streamed: ReadonlySet<string>;
  /** The type and the bytes still to come of a streamed frame being handed on. */
  private streaming: { type: string; left: number } | null = null;

  constructor(opts: { streamed?: Iterable<string> } = {}) {
    this.streamed = new Set(opts.streamed ?? []);
  }

  push(chunk: Buffer): DecodedFrame[] {
    const out: DecodedFrame[] = [];
    if (this.streaming) {
      const take = Math.min(this.streaming.left, chunk.length);
      out.push({ type: this.streaming.type, payload: chunk.subarray(0, take) });
      this.streaming.left -= take;
      if (this.streaming.left === 0) this.streaming = null;
      chunk = chunk.subarray(take);
      if (!chunk.length) return out;
    }
    this.parts.push(chunk);
    this.size += chunk.length;
    while (this.size >= HEADER) {
      if (this.parts[0].length < HEADER) this.joinHead();
      const head = this.parts[0];
      const type = String.fromCharCode(head[0]);
      if (!FROM_BOXD.has(type)) throw new BoxdProtocolError(`boxd sent an unknown frame type 0x${head[0].toString(16)}`);
      const len = head.readUInt32BE(1);
      if (len > MAX_FRAME) throw new BoxdProtocolError(`boxd sent a frame of ${len} bytes (at most ${MAX_FRAME})`);
      if (this.size < HEADER + len && this.streamed.has(type)) {
        // What is here of it goes on now; the rest as it comes.
        this.parts[0] = head.subarray(HEADER);
        for (const p of this.parts) if (p.length) out.push({ type, payload: p });
        this.streaming = { type, left: HEADER + len - this.size };
        this.parts = [];
        this.size = 0;
        break;
      }
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

  /** Gathers a header split across chunks: only its bytes are copied, the rest stays as it came. */
  private joinHead(): void {
    const head: Buffer[] = [];
    let have = 0;
    while (have < HEADER && this.parts.length) {
      const p = this.parts[0];
      const take = Math.min(HEADER - have, p.length);
      head.push(p.subarray(0, take));
      have += take;
      if (take === p.length) this.parts.shift();
      else this.parts[0] = p.subarray(take);
    }
    this.parts.unshift(Buffer.concat(head));
  }

  /** Bytes of a frame begun but not complete and held here (a streamed frame's bytes are
   *  handed on as they come: not counted). */
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
  /** 1.3.0 on: the process outlives the connection (its output dropped from then on). */
  noHup?: boolean;
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
