import { BufferPool, type Lease } from '../../../core/bufferLease';

/** A file read's socket is read up to LARGE_READ at a time (boxd holds up to 4 MiB in flight on
 *  it); a read shorter than KEEP_READ is copied out and its buffer used again, so a piece
 *  handed on never holds more than twice its size. */
const LARGE_READ = 1 << 20;
const KEEP_READ = LARGE_READ / 2;
/** The read buffers of every file read of this process, 16 MiB of them kept idle at most. */
const readPool = new BufferPool(LARGE_READ, 16);

/** How the file reads' buffers were had: allocated, or used again (tests, diagnostics). */
export function readBufferCounts(): { made: number; reused: number; idle: number } {
  return { made: readPool.made, reused: readPool.reused, idle: readPool.idleCount };
}

/**
 * Reads of a file's stream, up to 1 MiB at a time into buffers of the node's own (net.Socket's
 * `onread`), where a socket's reads are 64 KiB each: a 256 MiB download took 4096 reads, 4096
 * stream pushes and 4096 writes to the client's socket, and the node's CPU for it halved with
 * 1 MiB reads (docs/decisions.md "A file read's socket is read 1 MiB at a time"). A read of
 * half a buffer or more is handed on in place: `onChunk` gets its lease, to lend the pieces it
 * hands on (core/bufferLease.ts), and the buffer comes back to the pool once they are all
 * released (docs/decisions.md "Download buffers are used again"). A shorter one (a slow
 * reader, the head frame, the tail) is copied out at its size and the buffer kept, so a
 * trickle does not pin 1 MiB per piece. `keeps()`: whether the decoder still holds bytes of
 * the last read (a frame begun), which then must not be read over.
 */
export function largeReadsInto(onChunk: (b: Buffer, lease?: Lease) => void, keeps: () => boolean): { buffer: () => Buffer; callback: (n: number, b: Buffer) => void; end: () => void } {
  let next: Lease | null = null;
  return {
    buffer: () => (next ??= readPool.take()).buffer,
    callback: (n, b) => {
      const lease = next!;
      if (n < KEEP_READ) {
        onChunk(Buffer.from(b.subarray(0, n)));
        return;
      }
      next = null;
      onChunk(b.subarray(0, n), lease);
      lease.close(!keeps());
    },
    // The socket is closed: the buffer it would have read into next goes back.
    end: () => {
      next?.close(true);
      next = null;
    },
  };
}
