import fs from 'node:fs';
import path from 'node:path';
import type { IdMap } from '../../core/box';
import { run } from '../../core/command';
import { ensureNetnsDir } from './netnsDir';

/**
 * A box's user namespace and the network namespace that belongs to it.
 *
 * `runc exec` (1.1) joins a container's namespaces user namespace first. A netns made by
 * `ip netns add` belongs to the host's user namespace, which a process already inside the box's
 * cannot enter: every exec failed with "failed to setns into net namespace: Operation not
 * permitted" (runc 1.2 joins in two stages, opencontainers/runc#4492; Debian's 1.1.5 does not).
 * So the box's netns is made inside the box's own user namespace before the container starts,
 * and both are kept as nsfs bind mounts: the netns where the network driver keeps it
 * (`/run/netns/…`), the user namespace in USERNS_DIR, which the container joins by path. That
 * the netns belongs to the box also lets runc mount a fresh sysfs and set the box's namespaced
 * sysctls, and lets root in the box bind ports below 1024, as without a user namespace.
 */
export const USERNS_DIR = '/run/boxhost/userns';
const MARKER = '.ids';
/** Ends the marker of a netns made with its loopback up. */
const LO_UP = ' lo';
const MAKE_TIMEOUT_MS = 30_000;

export class BoxNamespaces {
  constructor(
    /** boxd, whose host mode `netns` makes the namespaces. */
    private readonly boxd: string,
    private readonly dir: string = USERNS_DIR,
  ) {}

  usernsPath(containerId: string): string {
    return path.join(this.dir, containerId);
  }

  /** `<net ns inode> <user ns inode> <netns path>` as they were when made: a netns replaced by
   *  someone else (or gone with /run at a reboot) no longer matches. */
  private markerPath(containerId: string): string {
    return `${this.usernsPath(containerId)}${MARKER}`;
  }

  /** Synchronous on purpose: three tiny calls, on every start's path, cost microseconds this
   *  way and milliseconds through a busy fs pool. */
  async owns(containerId: string, netnsPath: string): Promise<boolean> {
    return this.made(containerId, netnsPath) !== null;
  }

  /** Whether the netns of `containerId` was made with its loopback up (by `make`): a netns
   *  made before `make` did so (marker without ` lo`) still wants the CNI loopback plugin. */
  async loopbackUp(containerId: string, netnsPath: string): Promise<boolean> {
    return this.made(containerId, netnsPath)?.loopbackUp === true;
  }

  /** How the netns at `netnsPath` was made for `containerId` (null: not by this, or replaced). */
  private made(containerId: string, netnsPath: string): { loopbackUp: boolean } | null {
    try {
      const net = fs.statSync(netnsPath);
      const user = fs.statSync(this.usernsPath(containerId));
      const marker = fs.readFileSync(this.markerPath(containerId), 'utf8');
      const ids = `${net.ino} ${user.ino} ${netnsPath}`;
      if (marker === ids) return { loopbackUp: false };
      if (marker === `${ids}${LO_UP}`) return { loopbackUp: true };
      return null;
    } catch {
      return null;
    }
  }

  /**
   * Lets go of the user namespaces whose netns is gone (the network driver deleted it with its
   * box), whichever host made them: a test host torn down, or a box whose delete died half-way,
   * leaves its user namespace mounted until then. Reconciliation runs it (through `list`);
   * a delete releases its own box's at once.
   */
  async sweep(): Promise<void> {
    const names = await fs.promises.readdir(this.dir).catch(() => [] as string[]);
    for (const name of names.filter((n) => n.endsWith(MARKER))) {
      const containerId = name.slice(0, -MARKER.length);
      const marker = await fs.promises.readFile(path.join(this.dir, name), 'utf8').catch(() => '');
      const [netIno, , netnsPath] = marker.split(' ');
      const net = netnsPath ? await fs.promises.stat(netnsPath).catch(() => null) : null;
      if (!net || String(net.ino) !== netIno) await this.release(containerId);
    }
  }

  /**
   * Makes the box's user namespace and a netns inside it, with its loopback up, bound onto
   * their files (what was mounted there is detached first, so the new one replaces it). One
   * host program does it all, `boxd netns` (boxd/netns.go): ≈7 ms, where `unshare`, two
   * `mount --bind` and the CNI loopback plugin took ≈40 ms of processes beside each create.
   */
  async make(containerId: string, netnsPath: string, idMap: IdMap): Promise<void> {
    const userns = this.usernsPath(containerId);
    await Promise.all([fs.promises.mkdir(this.dir, { recursive: true, mode: 0o700 }), fs.promises.mkdir(path.dirname(netnsPath), { recursive: true })]);
    // The netns must be mounted in /run/netns as its own mount, never under it (netnsDir.ts).
    await ensureNetnsDir(path.dirname(netnsPath));
    // Bind mount targets must exist.
    await Promise.all([touch(userns), touch(netnsPath)]);
    await run([this.boxd, 'netns', userns, netnsPath, String(idMap.hostId), String(idMap.size)], { timeoutMs: MAKE_TIMEOUT_MS });
    const [net, user] = await Promise.all([fs.promises.stat(netnsPath), fs.promises.stat(userns)]);
    await fs.promises.writeFile(this.markerPath(containerId), `${net.ino} ${user.ino} ${netnsPath}${LO_UP}`, { mode: 0o600 });
  }

  /** Lets the box's user namespace go (its netns is the network driver's to delete). */
  async release(containerId: string): Promise<void> {
    const userns = this.usernsPath(containerId);
    if (fs.existsSync(userns)) await run(['umount', '-l', userns], { allowFailure: true });
    await Promise.all([fs.promises.rm(userns, { force: true }), fs.promises.rm(this.markerPath(containerId), { force: true })]);
  }
}

/** Makes `file` if missing (an nsfs file already there cannot be opened for writing). */
async function touch(file: string): Promise<void> {
  try {
    await (await fs.promises.open(file, 'wx', 0o600)).close();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  }
}
