import fs from 'node:fs';

/**
 * A process named by pid and start time, so a pid the kernel has since given to another process
 * is not taken for it: who owns a test dir (test/helpers/owner.ts), who started the embedded
 * redis-server (core/redis.ts).
 */

/** The fields of /proc/<pid>/stat after the command name (which may hold spaces), from the
 *  state on: field N of proc(5) is at index N − 3. Null when the process is gone. */
export function statFields(pid: number | 'self'): string[] | null {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null;
  }
}

/** The process's start time (field 22 of /proc/<pid>/stat); null when it is gone or a zombie
 *  (dead, not yet reaped). */
export function startTime(pid: number): string | null {
  const fields = statFields(pid);
  if (!fields || fields[0] === 'Z' || fields[0] === 'X') return null;
  return fields[19] ?? null;
}

/** `<pid> <start time>` of a process (this one by default). */
export const processStamp = (pid = process.pid) => `${pid} ${startTime(pid)}`;

/** The pid of the running process whose stamp `text` is, else null. */
export function stampedProcess(text: string): number | null {
  const [pid, start] = text.trim().split(' ');
  const n = Number(pid);
  if (!Number.isInteger(n) || n <= 0) return null;
  return start && startTime(n) === start ? n : null;
}
