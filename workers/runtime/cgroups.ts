import fs from 'node:fs';
import path from 'node:path';
import { sleep } from '../../core/command';
import type { DriverLogger } from '../drivers';

/**
 * A box's cgroups (v1: the same flat path under every controller, `cgroupsPath`), removed when
 * its container goes and before a start that finds some left (they would carry an earlier
 * container's limits over).
 */

const CGROUP_ROOT = '/sys/fs/cgroup';
/** How long a busy cgroup directory (tasks still exiting) is tried again. */
const CGROUP_BUSY_MS = 20_000;

let controllers: string[] | undefined;

/** Whether any controller still has the cgroup `cgroupsPath` (`/<container id>`). */
export function hasCgroupLeftovers(cgroupsPath: string): boolean {
  const rel = cgroupsPath.slice(1);
  try {
    controllers ??= fs.readdirSync(CGROUP_ROOT);
  } catch {
    return false;
  }
  return ['', ...controllers].some((c) => fs.existsSync(path.join(CGROUP_ROOT, c, rel)));
}

/** Removes the cgroup `cgroupsPath` (and its children) under every controller. A cgroup whose
 *  thousands of killed tasks the kernel is still reaping answers EBUSY for a moment (a box
 *  stopped at its pids limit): tried again for up to 20 s, then logged and left. */
export async function removeCgroups(cgroupsPath: string, logger: DriverLogger | undefined, context: Record<string, unknown>): Promise<void> {
  const rel = cgroupsPath.slice(1);
  let all: string[];
  try {
    all = await fs.promises.readdir(CGROUP_ROOT);
  } catch {
    return;
  }
  const deadline = Date.now() + CGROUP_BUSY_MS;
  for (const c of ['', ...all]) {
    for (;;) {
      try {
        await rmdirTree(path.join(CGROUP_ROOT, c, rel));
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EBUSY' && Date.now() < deadline) {
          await sleep(50);
          continue;
        }
        logger?.warn({ err: String(e), ...context, controller: c }, 'cannot remove cgroup');
        break;
      }
    }
  }
}

/** rmdir a cgroup directory and its (empty) children, deepest first. Missing is fine. */
async function rmdirTree(dir: string): Promise<void> {
  let entries: fs.Dirent[];
  try {
    entries = await fs.promises.readdir(dir, { withFileTypes: true });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return;
    throw e;
  }
  for (const e of entries) if (e.isDirectory()) await rmdirTree(path.join(dir, e.name));
  try {
    await fs.promises.rmdir(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}
