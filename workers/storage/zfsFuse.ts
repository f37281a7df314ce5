/**
 * The zfs-fuse daemon: how the storage driver starts it when no ZFS answers, and how the storage
 * watchdog (workers/storageWatchdog.ts) tells it is gone and restarts it. Kernel ZFS has no
 * daemon; there `running()` is never asked (the driver only restarts a daemon it can see).
 */
import fs from 'node:fs';
import path from 'node:path';
import { run, sleep, type RunResult } from '../../core/command';
import { processAlive, realDir, removeStalePidfile } from './hostFs';

export const ZFS_FUSE = '/usr/sbin/zfs-fuse';
export const ZFS_FUSE_PIDFILE = '/var/run/zfs-fuse.pid';
const COMM = 'zfs-fuse';

/** `zpool`/`zfs` failing because no ZFS answers at all (no daemon, no module). */
export const isDaemonDown = (text: string) => /failed to initialize ZFS library|zfs-fuse daemon|modules are not loaded|\/dev\/zfs/i.test(text);

export class ZfsFuseDaemon {
  constructor(private readonly log: { info(o: object, m: string): void; warn(o: object, m: string): void }) {}

  /** Whether this host runs ZFS through zfs-fuse (installed), so a daemon can be restarted. */
  get installed(): boolean {
    return fs.existsSync(ZFS_FUSE);
  }

  /** The daemon's pid (from its pidfile, checked against the process's name), or null. */
  pid(): number | null {
    let pid: number;
    try {
      pid = Number(fs.readFileSync(ZFS_FUSE_PIDFILE, 'utf8').trim());
    } catch {
      return null;
    }
    if (!Number.isInteger(pid) || pid <= 0 || !processAlive(pid)) return null;
    try {
      // A zombie or a recycled pid is no daemon.
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      if (!stat.includes(`(${COMM})`) || / Z /.test(stat.slice(stat.lastIndexOf(')')))) return null;
    } catch {
      return null;
    }
    return pid;
  }

  /**
   * Starts the daemon and waits until `answers` says ZFS answers (20 s at most). A stale pidfile
   * (a daemon that died) makes zfs-fuse exit 1 without a word; so does a missing /var/lock.
   */
  async start(answers: () => Promise<boolean>): Promise<void> {
    if (!this.installed) throw new Error(`ZFS is not reachable and ${ZFS_FUSE} is not installed`);
    this.log.info({}, 'starting the zfs-fuse daemon');
    removeStalePidfile(ZFS_FUSE_PIDFILE, COMM);
    fs.mkdirSync(path.join(realDir('/var/lock'), 'zfs'), { recursive: true, mode: 0o700 });
    // zfs-fuse daemonizes itself (and closes our pipes), so this returns at once. A concurrent
    // start by another process fails here; the wait below tells whether one of them won.
    const started: RunResult = await run([ZFS_FUSE, '--pidfile', ZFS_FUSE_PIDFILE], { allowFailure: true, timeoutMs: 30_000 });
    for (let waited = 0; waited < 20_000; waited += 100) {
      if (await answers()) return;
      await sleep(100);
    }
    throw new Error(`zfs-fuse did not answer within 20 s (start exited ${started.exitCode}: ${started.stderr.trim()})`);
  }

  /**
   * Kills the daemon for good (SIGKILL ends a stopped or wedged one too) and waits until it is
   * gone: every FUSE request it left unanswered then fails (ENOTCONN) instead of hanging.
   */
  async kill(): Promise<void> {
    const pids = new Set<number>();
    const fromFile = this.pid();
    if (fromFile) pids.add(fromFile);
    // A daemon started without our pidfile is a daemon too.
    const ps = await run(['pgrep', '-x', COMM], { allowFailure: true, timeoutMs: 10_000 });
    for (const l of ps.stdout.split('\n')) if (/^\d+$/.test(l.trim())) pids.add(Number(l.trim()));
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    for (let waited = 0; [...pids].some(processAlive) && waited < 30_000; waited += 50) await sleep(50);
    const alive = [...pids].filter(processAlive);
    if (alive.length) throw new Error(`zfs-fuse (pid ${alive.join(', ')}) did not die within 30 s of SIGKILL`);
    fs.rmSync(ZFS_FUSE_PIDFILE, { force: true });
    this.log.warn({ pids: [...pids] }, 'killed the zfs-fuse daemon');
  }
}

/**
 * zfs-fuse mounts at most this many filesystems, machine-wide (MAX_FILESYSTEMS in its
 * src/zfs-fuse/fuse_listener.c): past it `zfs clone` succeeds, its mount is undone, and the
 * dataset stays busy. Kernel ZFS has no such limit.
 */
export const ZFS_FUSE_MAX_MOUNTS = 1000;

/** The sources (dataset names) of the zfs-fuse filesystems mounted on the machine, every pool's
 *  (`fuse.zfs` in mountinfo). Reads /proc only: answers while the daemon is hung. */
export function zfsFuseMounts(mountinfo = fs.readFileSync('/proc/self/mountinfo', 'utf8')): string[] {
  const out: string[] = [];
  for (const line of mountinfo.split('\n')) {
    const [fstype, source] = line.split(' - ')[1]?.split(' ') ?? [];
    if (fstype === 'fuse.zfs' && source) out.push(source);
  }
  return out;
}
