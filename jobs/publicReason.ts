/**
 * What a failed job may tell a project token (docs/decisions.md "Requests and errors"): what
 * failed and why in plain words, never a host command line, a host path or a tool's raw output.
 * The box `error` and operation `error` columns are read by project tokens, so the handlers'
 * `onFailed` and the worker store this; the full error goes to the node's log with the
 * operation id.
 *
 * It recognises errors by shape, not by class: the jobs layer may not import the host command
 * runner (`core/command.ts`, test/layers.test.ts), and a driver's error may come from anywhere.
 */

/** `CommandError` of core/command.ts: a host tool that exited non-zero. */
interface CommandShape {
  argv: string[];
  exitCode: number | null;
  stderr?: string;
  stdout?: string;
}

const isCommandError = (e: unknown): e is CommandShape =>
  typeof e === 'object' && e !== null && Array.isArray((e as CommandShape).argv) && 'exitCode' in e;

/** A Node system error (`ENOENT: no such file or directory, open '/var/…'`). */
interface ErrnoShape {
  code: string;
  syscall?: string;
}

const isErrno = (e: unknown): e is ErrnoShape =>
  typeof e === 'object' && e !== null && typeof (e as ErrnoShape).code === 'string' && /^E[A-Z0-9]+$/.test((e as ErrnoShape).code) &&
  (typeof (e as ErrnoShape).syscall === 'string' || typeof (e as { path?: unknown }).path === 'string' || typeof (e as { errno?: unknown }).errno === 'number');

/** The part of the node a host tool belongs to, by the tool's base name. */
function partOf(argv: string[]): string {
  // CNI calls are recorded as [`CNI_COMMAND=ADD`, plugin, …].
  const tool = (argv.find((a) => !a.includes('=')) ?? '').split('/').pop() ?? '';
  if (/^(zfs|zpool|mount|umount)$/.test(tool)) return 'storage';
  if (/^(runc|crun|tini)$/.test(tool)) return 'the container runtime';
  if (/^(ip|ip6?tables.*|nft|sysctl|bridge|host-local|loopback|portmap|firewall|tuning|macvlan|ipvlan|ptp)$/.test(tool)) return 'the network set-up';
  return 'a host tool';
}

/** The part of the node each operation of the host helper (boxd/spawner.go) belongs to. */
const HELPER_OPS = new Map([
  ['box-net', 'the network set-up'],
  ['nft-elements', 'the network set-up'],
  ['remount-private', 'storage'],
]);

/** Known causes in a tool's or the kernel's words, said in ours (first match wins). */
const CAUSES: [RegExp, string][] = [
  // host-local IPAM: the api admits no more boxes than a block holds (docs/decisions.md
  // "Network"); this is for a node whose layout differs from the api's, or a race it lost.
  [/no IP addresses available/i, "the project's network on this node has no free address (delete boxes of the project there)"],
  // runc: the kernel's per-user key quota (kernel.keys.maxkeys), shared by a project's boxes
  // on a node (workers/keyQuota.ts); before "disk quota" below, which it says too.
  [/session key/i, "the node's kernel key quota for the project's boxes is full (kernel.keys.maxkeys)"],
  [/no space left|out of space|quota exceeded|disk quota|ENOSPC|EDQUOT/i, 'out of space'],
  [/cannot allocate memory|out of memory|ENOMEM|oom/i, 'out of memory'],
  [/dataset is busy|resource busy|device or resource busy|EBUSY/i, 'a resource was busy'],
  [/permission denied|operation not permitted|EACCES|EPERM/i, 'permission denied on the node'],
  [/not a directory|ENOTDIR|is a directory|EISDIR|must be mounted on ordinary/i, 'a path has the wrong type'],
  [/error mounting|mount(ing)? failed|cannot mount|failed to mount/i, 'a mount could not be made'],
  [/already exists|EEXIST/i, 'something it makes already exists'],
  [/does not exist|no such|not found|ENOENT/i, 'something it needs does not exist'],
  [/timed? ?out|ETIMEDOUT|deadline/i, 'it timed out'],
  [/connection refused|ECONNREFUSED|ECONNRESET|broken pipe|EPIPE/i, 'a connection failed'],
  [/invalid argument|EINVAL/i, 'it was given an invalid argument'],
];

const causeOf = (text: string): string | undefined => CAUSES.find(([re]) => re.test(text))?.[1];

/**
 * Free text made safe: a command line embedded in it (`/usr/sbin/zfs clone … exited 1: …`, as a
 * wrapped CommandError reads) becomes "a host tool exited 1", a tool's raw output after
 * `exited N:` goes, and any other absolute path becomes `…`.
 */
function scrub(text: string): string {
  return text
    .replace(/(^|\s)\/\S+(?:\s+\S+)*?\s+exited (-?\d+|null)(?::[\s\S]*)?$/, '$1a host tool exited $2')
    .replace(/\bexited (-?\d+|null): [\s\S]*$/, 'exited $1')
    .replace(/(^|[\s'"`(=:,[])\/[^\s'"`(),;\]]*/g, '$1…')
    .replace(/\s+/g, ' ')
    .trim()
    .slice(0, 500);
}

/** The public text of why a job failed. */
export function publicReason(err: unknown): string {
  if (isCommandError(err)) {
    const cause = causeOf(`${err.stderr ?? ''}\n${err.stdout ?? ''}`);
    const how = err.exitCode === null ? 'it was killed' : `exit status ${err.exitCode}`;
    return `${partOf(err.argv)} failed: ${cause ? `${cause} (${how})` : how}`;
  }
  if (isErrno(err)) {
    // The node's host helper names its operation as the syscall (core/spawner.ts).
    const part = HELPER_OPS.get(err.syscall ?? '');
    if (part) return `${part} failed: ${causeOf(err.code) ?? 'system error'} (${err.code})`;
    return `a file operation on the node failed: ${causeOf(err.code) ?? 'system error'} (${err.code})`;
  }
  const message = err instanceof Error ? err.message : String(err);
  // The same IPAM exhaustion wrapped in free text (a CNI call line embedded in it).
  if (/no IP addresses available/i.test(message)) return `the network set-up failed: ${causeOf(message)}`;
  return scrub(message) || 'unknown error';
}
