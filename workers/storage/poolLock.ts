import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { DriverLogger } from '../drivers';

/** A wait for the lock this long is logged (a holder stuck in a hung zfs-fuse shows so). */
const SLOW_WAIT_MS = 30_000;

/**
 * One pool's lock for the operations that move snapshots between box roots (the delete of a
 * forked root or a fork, which promotes; a rollback; a box snapshot's destroy): held across every
 * process of the node, since its worker processes share the pool and no in-process lock orders
 * them. Data volumes take part in no promote and do not take it.
 *
 * A source and its fork deleted at once, unlocked, promoted and destroyed each other's
 * snapshots: 20 rounds of 20 left a root behind and failed the other delete
 * (test/storage-zfs.test.ts "a source and its forks deleted at once").
 *
 * Callers in this process take turns first; the one whose turn it is holds an exclusive
 * flock(2) on the pool's lock file through a `flock` child that keeps it until its stdin closes.
 * The child is in a process group of its own, so a signal to the worker's group (Ctrl-C, a
 * service manager's stop) does not take the lock from a job that is finishing. The kernel lets
 * go when the child ends: a worker killed mid-way never leaves it held (a `zfs` command it had
 * started may still run to its end meanwhile: each step under the lock is idempotent and looks
 * again at what is there). Calls under the lock must not take it again (they would wait for
 * themselves).
 */
export class PoolLock {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(
    readonly file: string,
    private readonly log?: DriverLogger,
  ) {}

  run<T>(fn: () => Promise<T>): Promise<T> {
    const mine = this.tail.then(
      () => this.holding(fn),
      () => this.holding(fn),
    );
    this.tail = mine.catch(() => undefined);
    return mine;
  }

  private async holding<T>(fn: () => Promise<T>): Promise<T> {
    fs.mkdirSync(path.dirname(this.file), { recursive: true });
    const child = spawn('flock', ['-x', this.file, 'sh', '-c', 'echo held; exec cat >/dev/null'], { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    child.stdin.on('error', () => undefined); // a child that ended: 'exit' says why
    const ended = new Promise<void>((resolve) => child.once('close', () => resolve()));
    const t0 = Date.now();
    const slow = setTimeout(() => this.log?.warn({ lock: this.file, waitedMs: Date.now() - t0 }, 'still waiting for the pool lock'), SLOW_WAIT_MS);
    let held = false;
    try {
      await new Promise<void>((resolve, reject) => {
        let out = '';
        let err = '';
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          if (out.includes('held\n')) resolve();
        });
        child.stderr.on('data', (d: Buffer) => (err += d.toString()));
        child.once('error', reject);
        child.once('exit', (code, signal) => {
          if (held) this.log?.warn({ lock: this.file, code, signal }, 'the pool lock was let go before its holder was done (its flock child ended)');
          reject(new Error(`flock on the pool lock ended (${signal ?? code}) before holding it: ${err.trim()}`));
        });
      });
    } finally {
      clearTimeout(slow);
    }
    held = true;
    try {
      return await fn();
    } finally {
      held = false;
      child.stdin.end();
      await ended;
    }
  }
}
