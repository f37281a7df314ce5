import type { Readable } from 'node:stream';
import type { DomainContext, Identity } from './context';
import path from 'node:path';
import { BoxhostError, invalidField } from '../core/errors';
import { AGENT_DIR } from '../core/box';
import type { FileList, FileStat } from '../core/apiTypes';
import { runningBox } from './boxNode';

/**
 * Files in a box (DESIGN.md §4 "Files", docs/files.md): through the box's node to its agent,
 * which resolves every path inside the box. Here: who may, which box, whether it runs, and the
 * path's form; the node does the rest.
 */

/** The most a path may be (Linux's PATH_MAX). */
export const MAX_PATH = 4096;

/** An absolute path without NUL, at most MAX_PATH bytes. */
export function checkPath(p: string): string {
  if (!p.startsWith('/')) throw invalidField('path', 'must be an absolute path');
  if (p.includes('\0')) throw invalidField('path', 'must not contain NUL');
  if (Buffer.byteLength(p) > MAX_PATH) throw invalidField('path', `must be at most ${MAX_PATH} bytes`);
  return p;
}

/** `mode` as the contract writes it: up to four octal digits ("0644", "4755"). */
export function parseMode(mode: string | undefined): number | undefined {
  if (mode === undefined) return undefined;
  if (!/^[0-7]{1,4}$/.test(mode)) throw invalidField('mode', 'must be octal digits, at most four ("0644", "4755")');
  return parseInt(mode, 8);
}

const boxNode = (ctx: DomainContext, identity: Identity, project: string, name: string) => runningBox(ctx, identity, project, name, 'files');

export async function statFile(ctx: DomainContext, identity: Identity, project: string, name: string, p: string): Promise<FileStat> {
  const { id, node } = await boxNode(ctx, identity, project, name);
  return node.fileStat(id, checkPath(p));
}

export async function listFiles(ctx: DomainContext, identity: Identity, project: string, name: string, p: string): Promise<FileList> {
  const { id, node } = await boxNode(ctx, identity, project, name);
  return node.fileList(id, checkPath(p));
}

export async function readFile(ctx: DomainContext, identity: Identity, project: string, name: string, p: string): Promise<{ stat: FileStat; data: Readable }> {
  const { id, node } = await boxNode(ctx, identity, project, name);
  return node.fileRead(id, checkPath(p));
}

/* AGENT_DIR: only the agent's binaries are bound read-only; the directory is the box's own, so
 * a link that leads there reaches what the box itself may change, and a write over a bound
 * binary meets the kernel: busy (409). The refusal is a guard for the caller, not a boundary. */

function checkWritable(p: string): string {
  const n = path.posix.normalize(checkPath(p));
  if (n === AGENT_DIR || n.startsWith(`${AGENT_DIR}/`)) throw new BoxhostError('permission_denied', `${AGENT_DIR} is where the box's agent is bound in; the files API does not change it`, [{ field: 'path', issue: `must not be ${AGENT_DIR} or under it` }]);
  return p;
}

export async function writeFile(ctx: DomainContext, identity: Identity, project: string, name: string, p: string, data: Readable, mode?: string): Promise<FileStat> {
  checkWritable(p);
  const m = parseMode(mode);
  const { id, node } = await boxNode(ctx, identity, project, name);
  return node.fileWrite(id, p, data, m);
}

export async function deleteFile(ctx: DomainContext, identity: Identity, project: string, name: string, p: string, recursive: boolean): Promise<void> {
  checkWritable(p);
  const { id, node } = await boxNode(ctx, identity, project, name);
  await node.fileDelete(id, p, recursive);
}
