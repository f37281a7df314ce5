import type { ExecOptions, ExecResult } from '../drivers';
import { ExecInputError } from '../errors';
import { BOX_BUSYBOX } from './ociSpec';

/** Runs a command in the box and collects its output (the runtime's own exec). */
export type BoxExec = (opts: ExecOptions) => Promise<ExecResult>;

export interface ResolvedUser {
  uid: number;
  gid: number;
  /** Supplementary groups (besides `gid`). */
  groups: number[];
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
}

interface GroupEntry {
  name: string;
  gid: number;
  members: string[];
}

const MAX_ID = 2 ** 32 - 2;

/**
 * `NAME`, `NAME:GROUP`, `UID`, `UID:GID`: names are looked up in the box's own /etc/passwd
 * and /etc/group, read by a process inside the box (so a symlink there resolves inside the
 * box, never on the host).
 */
export async function resolveUser(spec: string, exec: BoxExec): Promise<ResolvedUser> {
  const m = /^([^:]+)(?::([^:]+))?$/.exec(spec);
  if (!m) throw new ExecInputError(`invalid user ${JSON.stringify(spec)}`, 'user');
  const [, u, g] = m;
  const isNum = (s: string) => /^\d+$/.test(s) && Number(s) <= MAX_ID;
  if (isNum(u) && g !== undefined && isNum(g)) return { uid: Number(u), gid: Number(g), groups: [] };
  if (!isNum(u) && !/^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$/.test(u)) throw new ExecInputError(`invalid user ${JSON.stringify(spec)}`, 'user');

  const { passwd, group } = await readAccounts(exec);
  const users = parsePasswd(passwd);
  const groups = parseGroup(group);
  const entry = isNum(u) ? users.find((e) => e.uid === Number(u)) : users.find((e) => e.name === u);
  if (!entry && !isNum(u)) throw new ExecInputError(`unknown user ${JSON.stringify(u)} in the box`, 'user');
  const uid = entry ? entry.uid : Number(u);
  let gid = entry ? entry.gid : 0;
  if (g !== undefined) {
    if (isNum(g)) gid = Number(g);
    else {
      const ge = groups.find((e) => e.name === g);
      if (!ge) throw new ExecInputError(`unknown group ${JSON.stringify(g)} in the box`, 'user');
      gid = ge.gid;
    }
  }
  const extra = entry ? groups.filter((e) => e.members.includes(entry.name) && e.gid !== gid).map((e) => e.gid) : [];
  return { uid, gid, groups: [...new Set(extra)] };
}

/** The box's /etc/passwd and /etc/group (1 MiB each at most), read in one exec. */
async function readAccounts(exec: BoxExec): Promise<{ passwd: string; group: string }> {
  const sep = '\n--boxhost-accounts-separator--\n';
  const res = await exec({
    command: [BOX_BUSYBOX, 'sh', '-c', `head -c 1048576 /etc/passwd 2>/dev/null; printf '${sep.replace(/\n/g, '\\n')}'; head -c 1048576 /etc/group 2>/dev/null; true`],
    timeoutMs: 10_000,
  });
  if (res.exitCode !== 0) throw new Error(`reading the box's accounts failed (exit ${res.exitCode}): ${res.stderr.trim()}`);
  const i = res.stdout.lastIndexOf(sep);
  if (i < 0) return { passwd: res.stdout, group: '' };
  return { passwd: res.stdout.slice(0, i), group: res.stdout.slice(i + sep.length) };
}

function parsePasswd(text: string): PasswdEntry[] {
  const out: PasswdEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 4 || !f[0] || !/^\d+$/.test(f[2]) || !/^\d+$/.test(f[3])) continue;
    out.push({ name: f[0], uid: Number(f[2]), gid: Number(f[3]) });
  }
  return out;
}

function parseGroup(text: string): GroupEntry[] {
  const out: GroupEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length < 3 || !f[0] || !/^\d+$/.test(f[2])) continue;
    out.push({ name: f[0], gid: Number(f[2]), members: (f[3] ?? '').split(',').map((s) => s.trim()).filter(Boolean) });
  }
  return out;
}
