/**
 * Buffers a stream's producer reads into, lent out to its consumer in pieces and used again
 * once every piece is given back: a file download moves 256 MiB through the node in 1 MiB
 * reads, and a new 1 MiB Buffer for each read grew V8's external memory by the file's size.
 * Past a point the collector answered that with a mark-compact every 60–100 ms for the rest of
 * the process's life (the node's CPU for a download ×2.5; docs/decisions.md "Download buffers
 * are used again").
 *
 * The contract is narrow on purpose. A producer takes a Lease, reads into its buffer, lends
 * the pieces it hands on (`lend`) and closes the lease when it no longer touches the buffer
 * (`close`, saying whether anything it kept still refers to the bytes). A consumer that is done
 * with a piece (a socket write's callback: the socket no longer refers to it) calls `release`.
 * A piece never released (a consumer that does not know of leases, a stream cut short) keeps
 * its buffer out of the pool, and the collector frees it as before: forgetting is safe,
 * releasing early is not, so only `pipeReleasing` releases.
 */
import type { Readable, Writable } from 'node:stream';
import { finished } from 'node:stream/promises';

/** Which lease each lent piece belongs to (a piece is its own Buffer object, a view). */
const lent = new WeakMap<Buffer, Lease>();

/** Buffers of one size, at most `keep` of them idle. */
export class BufferPool {
  private readonly idle: Buffer[] = [];
  /** Buffers allocated, and takes served by one given back. */
  made = 0;
  reused = 0;

  constructor(
    readonly size: number,
    readonly keep: number,
  ) {}

  take(): Lease {
    const b = this.idle.pop();
    if (b) this.reused++;
    else this.made++;
    return new Lease(b ?? Buffer.allocUnsafeSlow(this.size), this);
  }

  /** How many buffers wait to be used again. */
  get idleCount(): number {
    return this.idle.length;
  }

  /** @internal: from a lease whose pieces are all back. */
  giveBack(b: Buffer): void {
    if (this.idle.length < this.keep) this.idle.push(b);
  }
}

/** One buffer of a pool, out with its producer and the pieces it lent. */
export class Lease {
  private out = 0;
  private open = true;

  constructor(
    readonly buffer: Buffer,
    private pool: BufferPool | null,
  ) {}

  /** `piece` goes to a consumer; returned as is. Lent only when it is a view of this buffer
   *  (a piece its producer had to copy elsewhere is not this lease's to track). */
  lend(piece: Buffer): Buffer {
    // (An empty piece is dropped by a stream's push, never released: not lent.)
    if (piece.buffer !== this.buffer.buffer || piece.length === 0) return piece;
    this.out++;
    lent.set(piece, this);
    return piece;
  }

  /** The producer is done with the buffer. `reusable`: false when something it keeps still
   *  refers to the buffer's bytes outside any lent piece (the buffer is then never reused). */
  close(reusable: boolean): void {
    this.open = false;
    if (!reusable) this.pool = null;
    this.settle();
  }

  /** @internal: `release` of one of this lease's pieces. */
  returned(piece: Buffer): void {
    if (lent.get(piece) !== this) return;
    lent.delete(piece);
    this.out--;
    this.settle();
  }

  private settle(): void {
    if (this.open || this.out > 0 || !this.pool) return;
    const pool = this.pool;
    this.pool = null; // once
    pool.giveBack(this.buffer);
  }
}

/** A consumer is done with `piece`: nothing refers to its bytes any more. A piece that was not
 *  lent (or was given back already) is left alone. */
export function release(piece: Buffer): void {
  lent.get(piece)?.returned(piece);
}

/**
 * `src` into `dest` with back-pressure, as stream.pipeline, each chunk released once `dest` is
 * done with it (its write callback without an error: a socket no longer refers to it). `dest`
 * must be one whose callback means that (a socket, an HTTP response), never a stream that keeps
 * chunks after calling back (a PassThrough). Rejects on either side's failure or a close before
 * the end, with both destroyed.
 */
export async function pipeReleasing(src: Readable, dest: Writable): Promise<void> {
  const onData = (chunk: Buffer) => {
    const ok = dest.write(chunk, (err) => {
      if (!err) release(chunk);
    });
    if (!ok) src.pause();
  };
  const onDrain = () => src.resume();
  const onEnd = () => dest.end();
  src.on('data', onData);
  dest.on('drain', onDrain);
  if (dest.writableNeedDrain) src.pause();
  // A source that ended already emits no 'end' again.
  if (src.readableEnded) process.nextTick(onEnd);
  else src.once('end', onEnd);
  try {
    await Promise.all([finished(src), finished(dest)]);
  } catch (e) {
    src.destroy();
    dest.destroy();
    throw e;
  } finally {
    src.off('data', onData);
    dest.off('drain', onDrain);
    src.off('end', onEnd);
  }
}
