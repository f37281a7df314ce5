/**
 * The zfs-fuse daemon: how the storage driver starts it when no ZFS answers, and how the storage
 * watchdog (workers/storageWatchdog.ts) tells it is gone and restarts it. Kernel ZFS has no
 * daemon; there `running()` is never asked (the driver only restarts a daemon it can see).
 */
import fs from 'node:fs';
import path from 'node:path';
import { run, sleep, type RunResult } from '../../core/command';
import { processAlive, realDir, removeStalePidfile } from './hostFs';
import { ensureMountLock } from './zfsCommon';

export const ZFS_FUSE = '/usr/sbin/zfs-fuse';
export const ZFS_FUSE_PIDFILE = '/var/run/zfs-fuse.pid';
const COMM = 'zfs-fuse';

/** `zpool`/`zfs` failing because no ZFS answers at all (no daemon, no module). */
export const isDaemonDown = (text: string) => /failed to initialize ZFS library|zfs-fuse daemon|modules are not loaded|\/dev\/zfs/i.test(text);

/** Whether zfs-fuse serves ZFS on this machine (installed, and no kernel module's /dev/zfs). */
export const zfsFuseServes = (): boolean => fs.existsSync(ZFS_FUSE) && !fs.existsSync('/dev/zfs');

/** The machine's mount lock (zfsCommon.ts ZFS_FUSE_MOUNT_LOCK) where zfs-fuse serves, made
 *  ready; undefined on kernel ZFS, whose mounts need no turns. */
export const machineMountLock = (): string | undefined => (zfsFuseServes() ? ensureMountLock() : undefined);

export class ZfsFuseDaemon {
  /**
   * @param arcMb the ARC cap a daemon this class starts gets (`--max-arc-size`,
   *   BOXHOST_ZFS_FUSE_ARC_MB): see ROOTS_PER_ARC_MB.
   */
  constructor(
    private readonly log: { info(o: object, m: string): void; warn(o: object, m: string): void },
    readonly arcMb = DEFAULT_ZFS_FUSE_ARC_MB,
  ) {}

  /** Whether this host runs ZFS through zfs-fuse (installed), so a daemon can be restarted. */
  get installed(): boolean {
    return fs.existsSync(ZFS_FUSE);
  }

  /** The running daemon's ARC cap in MB (daemonArcMb), whoever started it. */
  runningArcMb(): number {
    return daemonArcMb(this.pid() ?? findByComm(COMM));
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
    this.log.info({ arcMb: this.arcMb }, 'starting the zfs-fuse daemon');
    removeStalePidfile(ZFS_FUSE_PIDFILE, COMM);
    fs.mkdirSync(path.join(realDir('/var/lock'), 'zfs'), { recursive: true, mode: 0o700 });
    // zfs-fuse daemonizes itself (and closes our pipes), so this returns at once. A concurrent
    // start by another process fails here; the wait below tells whether one of them won.
    const started: RunResult = await run([ZFS_FUSE, '--pidfile', ZFS_FUSE_PIDFILE, '--max-arc-size', String(this.arcMb)], { allowFailure: true, timeoutMs: 30_000 });
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

/**
 * The ARC cap of a daemon started by boxhost (BOXHOST_ZFS_FUSE_ARC_MB). Debian's
 * /etc/zfs/zfsrc says 100 MB, which holds ~390 mounted filesystems in use (ROOTS_PER_ARC_MB).
 */
export const DEFAULT_ZFS_FUSE_ARC_MB = 1024;

/**
 * What one MB of zfs-fuse's ARC holds: each mounted filesystem a process has looked into pins
 * ~256 KiB of metadata there, and once pinned metadata fills the ARC the daemon waits forever
 * for room (every FUSE request of the machine hangs; the watchdog then restarts it). Measured
 * (raw `zfs clone` + a read of a file in it, one at a time): the 100 MB of Debian's zfsrc hung
 * at ~390 filesystems, 200 MB at ~786, 1024 MB held all 990. Counted lower, as 3 per MB, for
 * what a running box touches besides.
 */
export const ROOTS_PER_ARC_MB = 3;

/** What a `max-arc-size` of zfs-fuse nobody set is taken to be: Debian's zfsrc value. */
const ASSUMED_ARC_MB = 100;

/** /etc/zfs/zfsrc as a daemon would read it, and when it was last changed. */
export interface Zfsrc {
  text: string;
  mtimeMs: number;
}

/**
 * The ARC cap (MB) of the running zfs-fuse daemon: its `--max-arc-size`/`-m` argument, else
 * the last `max-arc-size` of /etc/zfs/zfsrc (as zfs-fuse reads it: the last line wins, a
 * trailing `# comment` allowed), else 100. zfs-fuse reads zfsrc only when it starts: a zfsrc
 * changed since the daemon started says nothing about the daemon, so then 100 too.
 */
export function daemonArcMb(pid: number | null, zfsrc: Zfsrc = readZfsrc()): number {
  const argv = pid ? readOr(`/proc/${pid}/cmdline`).split('\0') : [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const inline = /^--max-arc-size=(\d+)$/.exec(a) ?? /^-m(\d+)$/.exec(a);
    if (inline) return Number(inline[1]);
    if ((a === '--max-arc-size' || a === '-m') && /^\d+$/.test(argv[i + 1] ?? '')) return Number(argv[i + 1]);
  }
  const started = pid ? processStartMs(pid) : null;
  if (started !== null && zfsrc.mtimeMs > started) return ASSUMED_ARC_MB;
  let value: number | null = null;
  for (const line of zfsrc.text.split('\n')) {
    const m = /^\s*max-arc-size\s*=\s*(\d+)\s*(#.*)?$/.exec(line);
    if (m) value = Number(m[1]);
  }
  return value ?? ASSUMED_ARC_MB;
}

function readZfsrc(file = '/etc/zfs/zfsrc'): Zfsrc {
  try {
    return { text: fs.readFileSync(file, 'utf8'), mtimeMs: fs.statSync(file).mtimeMs };
  } catch {
    return { text: '', mtimeMs: 0 };
  }
}

/** When a process started (ms since the epoch), from its stat's starttime and the boot time;
 *  null when unknown. Clock ticks are 100 a second on Linux (USER_HZ). */
export function processStartMs(pid: number): number | null {
  const stat = readOr(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // Fields after the name start at 3 (state); starttime is field 22.
  const ticks = Number(fields[22 - 3]);
  const btime = /^btime (\d+)$/m.exec(readOr('/proc/stat'));
  if (!Number.isFinite(ticks) || !btime) return null;
  return Number(btime[1]) * 1000 + (ticks / 100) * 1000;
}

/** The first process named `comm`, from /proc (a daemon started without our pidfile). */
function findByComm(comm: string): number | null {
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    if (readOr(`/proc/${name}/comm`).trim() === comm) return Number(name);
  }
  return null;
}

function readOr(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
