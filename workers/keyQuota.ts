import fs from 'node:fs';
import type { Logger } from '../core/logger';

/**
 * The kernel's key quota per user, raised to hold a full project block (docs/decisions.md
 * "Network"). runc gives every container a session keyring of its own, and the kernel charges
 * it to the container's root as seen from the host: with user namespaces that is one host uid
 * per project (core/box.ts `projectIdMap`), so all of a project's boxes on a node share one
 * quota. The default (`kernel.keys.maxkeys` 200) stops a project at 200 running boxes on a node,
 * below the 1021 addresses of its /22: the 201st fails inside its job ("unable to join session
 * keyring: disk quota exceeded"). Boxes cannot make keys themselves (seccomp blocks keyctl).
 */

const MAXKEYS = '/proc/sys/kernel/keys/maxkeys';
const MAXBYTES = '/proc/sys/kernel/keys/maxbytes';
/** Keys of a box user that are not boxes' session keyrings (its `_uid` and `_uid_ses`). */
const HEADROOM = 16;
/** The kernel's own ratio (20000 bytes for 200 keys); a box's keyring costs about 31. */
const BYTES_PER_KEY = 100;

/** What the quota must be for `boxesPerProject` boxes of one project on a node. */
export const keyQuotaFor = (boxesPerProject: number) => ({ keys: boxesPerProject + HEADROOM, bytes: (boxesPerProject + HEADROOM) * BYTES_PER_KEY });

/**
 * Raises `kernel.keys.maxkeys` and `maxbytes` to hold `boxesPerProject` (never lowers them: the
 * host may want more for its own users). Where they cannot be written (a node in a container
 * without a writable /proc/sys) it warns with the number of boxes a project will get.
 */
export async function raiseKeyQuota(boxesPerProject: number, log: Logger): Promise<void> {
  const want = keyQuotaFor(boxesPerProject);
  for (const [file, value] of [[MAXKEYS, want.keys], [MAXBYTES, want.bytes]] as const) {
    const current = Number((await fs.promises.readFile(file, 'utf8').catch(() => '')).trim());
    if (Number.isFinite(current) && current >= value) continue;
    try {
      await fs.promises.writeFile(file, String(value));
      log.info({ sysctl: file, from: current, to: value }, 'kernel key quota raised for a full project block');
    } catch (e) {
      log.warn(
        { sysctl: file, current, want: value, err: (e as Error).message },
        `cannot raise ${file}: a project will run at most about ${file === MAXKEYS ? current - HEADROOM : Math.floor(current / BYTES_PER_KEY) - HEADROOM} boxes on this node (its block holds ${boxesPerProject}); raise it on the host`,
      );
    }
  }
}
