import { PassThrough, Readable, Writable } from 'node:stream';
import t from 'tap';
import { BufferPool, pipeReleasing, release } from '../core/bufferLease';

t.test('a buffer comes back once its producer closed it and every lent piece is released', async (t) => {
  const pool = new BufferPool(64, 4);
  const a = pool.take();
  const p1 = a.lend(a.buffer.subarray(0, 10));
  const p2 = a.lend(a.buffer.subarray(10, 30));
  a.close(true);
  t.equal(pool.idleCount, 0, 'two pieces out: not back');
  release(p1);
  release(p1); // twice: counted once
  t.equal(pool.idleCount, 0, 'one piece out: not back');
  release(p2);
  t.equal(pool.idleCount, 1, 'all pieces back: the buffer is idle');
  const b = pool.take();
  t.equal(b.buffer, a.buffer, 'the next take is served by it');
  t.same({ made: pool.made, reused: pool.reused }, { made: 1, reused: 1 });
});

t.test('released before the producer is done: back only at close', async (t) => {
  const pool = new BufferPool(64, 4);
  const a = pool.take();
  release(a.lend(a.buffer.subarray(0, 8)));
  t.equal(pool.idleCount, 0, 'the producer may still read into it');
  a.close(true);
  t.equal(pool.idleCount, 1);
});

t.test('a buffer its producer still refers to, or a piece never released, never comes back', async (t) => {
  const pool = new BufferPool(64, 4);
  const held = pool.take();
  release(held.lend(held.buffer.subarray(0, 8)));
  held.close(false);
  t.equal(pool.idleCount, 0, 'closed as not reusable');
  const kept = pool.take();
  kept.lend(kept.buffer.subarray(0, 8));
  kept.close(true);
  t.equal(pool.idleCount, 0, 'a piece still out');
  t.not(pool.take().buffer, kept.buffer, 'a new buffer is made instead');
  t.equal(pool.made, 3);
});

t.test('only views of the buffer are lent; a copy is left alone', async (t) => {
  const pool = new BufferPool(64, 4);
  const a = pool.take();
  const copy = Buffer.from(a.buffer.subarray(0, 8));
  t.equal(a.lend(copy), copy, 'returned as is');
  a.close(true);
  t.equal(pool.idleCount, 1, 'the copy does not hold the buffer out');
  release(copy); // not lent: nothing happens
  release(Buffer.alloc(4));
  t.equal(pool.idleCount, 1);
});

t.test('the pool keeps at most `keep` idle buffers', async (t) => {
  const pool = new BufferPool(16, 2);
  const leases = [pool.take(), pool.take(), pool.take()];
  for (const l of leases) l.close(true);
  t.equal(pool.idleCount, 2);
});

/** A writable whose writes complete only when the test says (a socket whose kernel buffer is
 *  full), recording the chunks. */
function heldWritable(highWaterMark = 16) {
  const pending: ((e?: Error | null) => void)[] = [];
  const chunks: Buffer[] = [];
  const w = new Writable({
    highWaterMark,
    write(chunk: Buffer, _enc, cb) {
      chunks.push(chunk);
      pending.push(cb);
    },
  });
  return { w, chunks, complete: (err?: Error) => pending.shift()!(err) };
}

t.test('pipeReleasing releases a piece only once its write completed without an error', async (t) => {
  const pool = new BufferPool(32, 4);
  const a = pool.take();
  const pieces = [a.lend(a.buffer.subarray(0, 8)), a.lend(a.buffer.subarray(8, 16))];
  a.close(true);
  const src = new PassThrough();
  const { w, chunks, complete } = heldWritable();
  const done = pipeReleasing(src, w);
  src.write(pieces[0]);
  src.end(pieces[1]);
  while (chunks.length < 1) await new Promise((r) => setImmediate(r));
  t.equal(chunks[0], pieces[0], 'the piece itself is written (no copy)');
  t.equal(pool.idleCount, 0, 'written, not completed: still out');
  complete();
  while (chunks.length < 2) await new Promise((r) => setImmediate(r));
  t.equal(pool.idleCount, 0, 'one of two completed');
  complete();
  await done;
  t.equal(pool.idleCount, 1, 'both completed: the buffer is back');

  // A write that fails: its piece stays out (the writer may still hold it).
  const b = pool.take();
  const piece = b.lend(b.buffer.subarray(0, 4));
  b.close(true);
  const src2 = new PassThrough();
  const h2 = heldWritable();
  const failed = pipeReleasing(src2, h2.w);
  src2.write(piece);
  while (h2.chunks.length < 1) await new Promise((r) => setImmediate(r));
  h2.complete(new Error('socket gone'));
  await t.rejects(failed, /socket gone/);
  t.equal(pool.idleCount, 0, 'a failed write releases nothing');
  t.ok(src2.destroyed, 'the source is destroyed');
});

t.test('pipeReleasing: back-pressure, and either side failing ends both', async (t) => {
  // The source pauses while the destination is full.
  const src = new Readable({ read() {} });
  const { w, complete } = heldWritable(4);
  const done = pipeReleasing(src, w);
  src.push(Buffer.alloc(8));
  await new Promise((r) => setImmediate(r));
  t.ok(src.isPaused(), 'paused: the destination took more than its mark');
  complete();
  await new Promise((r) => setImmediate(r));
  t.notOk(src.isPaused(), 'resumed on drain');
  src.push(null);
  await done;

  const src2 = new Readable({ read() {} });
  const h2 = heldWritable();
  const p2 = pipeReleasing(src2, h2.w);
  src2.destroy(new Error('boxd went away'));
  await t.rejects(p2, /boxd went away/);
  t.ok(h2.w.destroyed, 'a source failing destroys the destination');

  const src3 = new Readable({ read() {} });
  const h3 = heldWritable();
  const p3 = pipeReleasing(src3, h3.w);
  h3.w.destroy();
  await t.rejects(p3, { code: 'ERR_STREAM_PREMATURE_CLOSE' });
  t.ok(src3.destroyed, 'a destination closing early destroys the source');
});

t.test('an empty piece is not lent (a stream drops it, nothing would release it)', async (t) => {
  const pool = new BufferPool(16, 2);
  const a = pool.take();
  a.lend(a.buffer.subarray(4, 4));
  a.close(true);
  t.equal(pool.idleCount, 1, 'back at close');
});

t.test('pipeReleasing from a source that has ended already, into a destination that waits for drain', async (t) => {
  const src = new PassThrough();
  src.end(Buffer.from('x'));
  src.resume();
  await new Promise((r) => src.once('end', r));
  const { w } = heldWritable();
  await t.resolves(pipeReleasing(src, w), 'the destination is ended: no hang');
  t.ok(w.writableFinished);

  const full = heldWritable(2);
  full.w.write(Buffer.alloc(4)); // over its mark: waits for drain
  const src2 = new Readable({ read() {} });
  src2.push(Buffer.alloc(1));
  const p = pipeReleasing(src2, full.w);
  await new Promise((r) => setImmediate(r));
  t.ok(src2.isPaused(), 'a destination that waits for drain pauses the source from the start');
  t.equal(full.chunks.length, 1, 'nothing more written meanwhile');
  full.complete();
  src2.push(null);
  while (full.chunks.length < 2) await new Promise((r) => setImmediate(r));
  full.complete();
  await p;
});
