import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { IdMap } from '../../core/box';
import { run, sleep } from '../../core/command';
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
const UNSHARE = '/usr/bin/unshare';
const MARKER = '.ids';

export class BoxNamespaces {
  constructor(
    private readonly busybox: string,
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
    try {
      const net = fs.statSync(netnsPath);
      const user = fs.statSync(this.usernsPath(containerId));
      return fs.readFileSync(this.markerPath(containerId), 'utf8') === `${net.ino} ${user.ino} ${netnsPath}`;
    } catch {
      return false;
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

  async make(containerId: string, netnsPath: string, idMap: IdMap): Promise<void> {
    const userns = this.usernsPath(containerId);
    await Promise.all([fs.promises.mkdir(this.dir, { recursive: true, mode: 0o700 }), fs.promises.mkdir(path.dirname(netnsPath), { recursive: true })]);
    // The netns must be mounted in /run/netns as its own mount, never under it (netnsDir.ts).
    await ensureNetnsDir(path.dirname(netnsPath));
    // Bind mount targets must exist.
    await Promise.all([touch(userns), touch(netnsPath)]);
    // The holder: a process in a new user namespace and a netns made inside it. It waits on its
    // stdin until both are bind-mounted, then goes.
    const holder = spawn(UNSHARE, ['--user', '--net', '--', this.busybox, 'sh', '-c', 'read _'], { stdio: ['pipe', 'ignore', 'ignore'] });
    const exited = new Promise<void>((resolve) => holder.once('exit', () => resolve()).once('error', () => resolve()));
    try {
      const pid = holder.pid;
      if (!pid) throw new Error(`${UNSHARE} did not start`);
      await untilUnshared(pid);
      const map = `0 ${idMap.hostId} ${idMap.size}\n`;
      await fs.promises.writeFile(`/proc/${pid}/uid_map`, map);
      await fs.promises.writeFile(`/proc/${pid}/gid_map`, map);
      // What is mounted there already (a netns `ip netns add` made, an earlier pair of this box)
      // is unmounted first, so the new one replaces it rather than stacking on it.
      await Promise.all(
        [
          [`/proc/${pid}/ns/user`, userns],
          [`/proc/${pid}/ns/net`, netnsPath],
        ].map(async ([source, target]) => {
          if (await isMountPoint(target)) await run(['umount', '-l', target], { allowFailure: true });
          await run(['mount', '--bind', source, target]);
        }),
      );
    } finally {
      holder.stdin?.end();
      holder.kill('SIGKILL');
      await exited;
    }
    const [net, user] = await Promise.all([fs.promises.stat(netnsPath), fs.promises.stat(userns)]);
    await fs.promises.writeFile(this.markerPath(containerId), `${net.ino} ${user.ino} ${netnsPath}`, { mode: 0o600 });
  }

  /** Lets the box's user namespace go (its netns is the network driver's to delete). */
  async release(containerId: string): Promise<void> {
    const userns = this.usernsPath(containerId);
    if (fs.existsSync(userns)) await run(['umount', '-l', userns], { allowFailure: true });
    await Promise.all([fs.promises.rm(userns, { force: true }), fs.promises.rm(this.markerPath(containerId), { force: true })]);
  }
}

/** Whether something is mounted at `file` (its device is not its directory's). */
async function isMountPoint(file: string): Promise<boolean> {
  const [f, d] = await Promise.all([fs.promises.stat(file), fs.promises.stat(path.dirname(file))]);
  return f.dev !== d.dev;
}

/** Makes `file` if missing (an nsfs file already there cannot be opened for writing). */
async function touch(file: string): Promise<void> {
  try {
    await (await fs.promises.open(file, 'wx', 0o600)).close();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  }
}

/** Waits until process `pid` is in a user namespace other than ours (unshare(2) has run). */
async function untilUnshared(pid: number): Promise<void> {
  const ours = await fs.promises.readlink('/proc/self/ns/user');
  for (let i = 0; i < 5000; i++) {
    const theirs = await fs.promises.readlink(`/proc/${pid}/ns/user`).catch(() => null);
    if (theirs === null) throw new Error(`${UNSHARE} exited before making the box's namespaces`);
    if (theirs !== ours) return;
    await sleep(i < 50 ? 0 : 1);
  }
  throw new Error(`${UNSHARE} did not make the box's namespaces within 5 s`);
}
