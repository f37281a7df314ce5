import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { sleep } from '../../core/command';

/** How long the follower waits for more bytes before it looks again. */
const IDLE_MS = 5;
/** A flush is asked for once this much more was written since the last one. */
const FLUSH_EVERY_BYTES = 32 * 1024 * 1024;

/**
 * Hashes and flushes a file while another process writes it (a `zfs send` whose stdout is the
 * file), so that neither waits for the writer to end: the sha256 is read from the page cache
 * right behind the writer, and `fdatasync` is asked for every 32 MiB so the disk writes overlap
 * the stream instead of all coming at the end. Once `finish()` is called (the writer exited), the
 * rest is read, one last fdatasync is made, and the file's sha256 and size are answered.
 *
 * `out` is the writer's descriptor (what fdatasync flushes); the file is read through a
 * descriptor of its own.
 */
export class FollowWriter {
  readonly hash = crypto.createHash('sha256');
  bytes = 0;
  private done = false;
  private flushedAt = 0;
  private readonly running: Promise<void>;

  constructor(
    private readonly file: string,
    private readonly out: fs.promises.FileHandle,
  ) {
    this.running = this.follow();
    // Seen by finish(); never an unhandled rejection meanwhile.
    this.running.catch(() => undefined);
  }

  private async follow(): Promise<void> {
    const inp = await fs.promises.open(this.file, 'r');
    const buf = Buffer.allocUnsafe(1024 * 1024);
    try {
      for (;;) {
        // Read after looking at `done`: a pass that starts after the writer ended reads to the end.
        const ended = this.done;
        const { bytesRead } = await inp.read(buf, 0, buf.length, this.bytes);
        if (bytesRead > 0) {
          this.hash.update(buf.subarray(0, bytesRead));
          this.bytes += bytesRead;
          if (!ended && this.bytes - this.flushedAt >= FLUSH_EVERY_BYTES) {
            this.flushedAt = this.bytes;
            await this.out.datasync();
          }
          continue;
        }
        if (ended) return;
        await sleep(IDLE_MS);
      }
    } finally {
      await inp.close();
    }
  }

  /** The writer is done: reads what is left, flushes, and answers what the file holds. */
  async finish(): Promise<{ bytes: number; sha256: string }> {
    this.done = true;
    await this.running;
    await this.out.sync();
    return { bytes: this.bytes, sha256: this.hash.digest('hex') };
  }

  /** The writer failed: stops following (the caller removes the file). */
  async abandon(): Promise<void> {
    this.done = true;
    await this.running.catch(() => undefined);
  }
}

/** The `.part-*` files of every attempt at `file` (a send of a killed worker may outlive it and
 *  go on writing into its own: unlinked, it writes into nothing anyone reads). */
export async function removeParts(file: string): Promise<void> {
  const dir = path.dirname(file);
  const prefix = `${path.basename(file)}.part`;
  const names = await fs.promises.readdir(dir).catch(() => [] as string[]);
  await Promise.all(names.filter((n) => n.startsWith(prefix)).map((n) => fs.promises.rm(path.join(dir, n), { force: true })));
}
