import fs from 'node:fs';
import { run } from '../../core/command';

/** Where named network namespaces live (iproute2's NETNS_RUN_DIR). */
export const NETNS_DIR = '/run/netns';
/** Held while the directory is made its own mount (every boxhost process on the host). */
const LOCK = '/run/boxhost-netns.lock';
const ready = new Set<string>();

/**
 * Makes /run/netns its own shared mount, as `ip netns add` does the first time it runs, before
 * any netns is bind-mounted in it. A netns bind-mounted there while it was still a plain
 * directory is hidden as soon as anything binds the directory over itself (the first
 * `ip netns add` after a boot does): it can then be neither unmounted nor removed ("Device or
 * resource busy") until the machine restarts — seen as leftover netns of the first test hosts on
 * a freshly booted CI machine. Once per process, under a lock shared by every boxhost process;
 * a directory that already holds netns mounts is left as it is (binding it would hide them).
 */
export async function ensureNetnsDir(dir = NETNS_DIR, warn?: (msg: string) => void): Promise<void> {
  if (ready.has(dir)) return;
  await fs.promises.mkdir(dir, { recursive: true });
  // Under the lock, from this moment's mount table: a mount at the directory (done), or under
  // it (left alone), else the bind. Field 5 of mountinfo is the mount point.
  const script = [
    'awk -v d="$1" \'$5 == d { f = 1 } END { exit !f }\' /proc/self/mountinfo && exit 0',
    'awk -v d="$1/" \'index($5, d) == 1 { f = 1 } END { exit !f }\' /proc/self/mountinfo && exit 3',
    'mount --bind "$1" "$1" && mount --make-shared "$1"',
  ].join('\n');
  const r = await run(['flock', LOCK, 'sh', '-c', script, 'sh', dir], { allowFailure: true });
  if (r.exitCode === 3) warn?.(`${dir} is no mount of its own and already holds network namespaces: left as it is`);
  else if (r.exitCode !== 0) throw new Error(`could not make ${dir} a shared mount: ${r.stderr.trim()}`);
  ready.add(dir);
}
