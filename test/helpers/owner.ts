import fs from 'node:fs';
import path from 'node:path';
import { processStamp, stampedProcess } from '../../core/procStamp';

/**
 * Which process a temp dir of the suite belongs to: the sweep (test/helpers/sweep.ts) leaves a
 * dir alone while its owner runs, so a sweep started beside a running suite, a bench-like script
 * or another developer's test never tears down a live test host under it. The owner is named by
 * pid and start time (a pid reused by another process is not the owner). A test process that
 * hangs on keeps its dirs until it is killed, under CI too.
 */
const OWNER_FILE = '.owner';

/** What a claim holds: this process's pid and start time. */
export const ownerStamp = () => `${processStamp()}\n`;

/** The pid of the running process whose stamp `text` is (this process's too), else null. */
export const stampOwner = stampedProcess;

/** Marks `dir` as this process's; returns it. */
export function claimDir(dir: string): string {
  fs.writeFileSync(path.join(dir, OWNER_FILE), ownerStamp());
  return dir;
}

/** The pid of the running process that claimed `dir`, else null (none claimed it, it ended, or
 *  it is this process). */
export function liveOwner(dir: string): number | null {
  let text: string;
  try {
    text = fs.readFileSync(path.join(dir, OWNER_FILE), 'utf8');
  } catch {
    return null;
  }
  const owner = stampOwner(text);
  return owner === process.pid ? null : owner;
}
