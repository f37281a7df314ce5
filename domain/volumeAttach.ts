import type { DomainContext, Identity } from './context';
import type { DataMount } from '../core/apiTypes';
import { volumesRepo, type VolumeRow } from '../db/repos/volumes';
import type { BoxRecord } from '../db/repos/boxes';
import { conflict, invalidField } from '../core/errors';
import { now } from '../core/ids';
import { AGENT_DIR } from '../core/box';
import { assertQuota } from './projects';

/**
 * The rules of attaching a data volume to a box (docs/data.md), shared by attach and by box
 * create with `data_mounts`.
 */

/** Paths a box may not have a volume under (besides the spec's table, which names these three
 *  themselves): the agent's own, and the kernel's filesystems the runtime mounts at each start
 *  (a bind under /proc is refused by runc, one under /dev or /sys meets the runtime's own mounts:
 *  the box could not start again). */
const SYSTEM_PREFIXES = [AGENT_DIR, '/proc', '/sys', '/dev'];
/** The files the runtime binds in at each start (workers/runtime/runc.ts): a volume there (or
 *  under one, as if it were a directory) meets a file where it needs a directory, and the box
 *  could not start again. */
const RUNTIME_FILES = ['/etc/hostname', '/etc/boxes-env'];

const sees = (identity: Identity, row: VolumeRow) => identity.projects === null || (row.project !== null && identity.projects.includes(row.project));

const STATE_WORDS: Record<VolumeRow['state'], string> = { creating: 'still being made', deleting: 'being deleted', restoring: 'being restored', ready: 'ready' };

/** 409 for a volume that is not `ready`, saying what it is doing. */
export const notReady = (vol: Pick<VolumeRow, 'name' | 'state'>) => conflict(`data volume ${vol.name} is ${STATE_WORDS[vol.state]}; try again once that is done`);

/** The volume if this caller may see it. */
export async function findVolume(ctx: Pick<DomainContext, 'db'>, identity: Identity, name: string): Promise<VolumeRow | undefined> {
  const row = await volumesRepo.byName(ctx.db, name);
  return row && sees(identity, row) ? row : undefined;
}

/** The volumes a create's `data_mounts` names, each checked to exist and all on one node. */
export async function volumesOf(ctx: Pick<DomainContext, 'db'>, identity: Identity, mounts: DataMount[]): Promise<{ vol: VolumeRow; mount: DataMount }[]> {
  const out: { vol: VolumeRow; mount: DataMount }[] = [];
  for (const [i, m] of mounts.entries()) {
    const vol = await findVolume(ctx, identity, m.name);
    if (!vol) throw invalidField(`data_mounts.${i}.name`, `data volume ${m.name} does not exist`);
    if (out.some((o) => o.vol.id === vol.id)) throw invalidField(`data_mounts.${i}.name`, `data volume ${m.name} is named twice`);
    if (out.length > 0 && out[0].vol.node !== vol.node) throw conflict(`data volumes ${out[0].vol.name} and ${vol.name} are on different nodes (${out[0].vol.node}, ${vol.node}); a box mounts volumes of its own node`);
    out.push({ vol, mount: { name: m.name, path: m.path, read_only: m.read_only ?? false } });
  }
  return out;
}

/** A mount path as the box will see it (normalised by the schema): none inside the agent's. */
function checkMountPath(path: string, field: string): void {
  if (SYSTEM_PREFIXES.some((p) => path === p || path.startsWith(`${p}/`))) throw invalidField(field, `must not be under ${SYSTEM_PREFIXES.join(', ')} (the box agent's and the kernel's filesystems)`);
  if (RUNTIME_FILES.some((p) => path === p || path.startsWith(`${p}/`))) throw invalidField(field, `must not be ${RUNTIME_FILES.join(' or ')} (files the runtime puts in every box at its start)`);
}

/** Whether `a` and `b` are the same path or one is inside the other. */
const nested = (a: string, b: string) => a === b || a.startsWith(`${b}/`) || b.startsWith(`${a}/`);

/**
 * The rules one attachment must pass, for attach and for box create: the volume ready, on the
 * box's node, of the box's project (or of none yet), not attached to this box already, and its
 * path clear of the box's other mounts. Answers the project the volume will belong to.
 */
export function checkAttach(vol: VolumeRow, box: Pick<BoxRecord, 'project' | 'name' | 'node' | 'data_mounts'>, path: string, field = 'name'): void {
  checkMountPath(path, field === 'name' ? 'path' : field);
  if (vol.state !== 'ready') throw notReady(vol);
  if (vol.project !== null && vol.project !== box.project) throw conflict(`data volume ${vol.name} belongs to project ${vol.project}; it can be attached only to that project's boxes`);
  if (vol.node !== box.node) throw conflict(`data volume ${vol.name} is on node ${vol.node} and box ${box.project}/${box.name} on node ${box.node}; a volume is attached on its own node`);
  if (box.data_mounts.some((m) => m.name === vol.name)) throw conflict(`data volume ${vol.name} is already attached to box ${box.project}/${box.name}`);
  const clash = box.data_mounts.find((m) => nested(m.path, path));
  if (clash) throw invalidField(field === 'name' ? 'path' : field, `${path} overlaps the mount of data volume ${clash.name} at ${clash.path}`);
}

/** Records an attachment (and the volume's project when it had none), inside `trx`. */
export async function recordAttach(ctx: DomainContext, trx: DomainContext['db'], vol: VolumeRow, box: BoxRecord, mount: DataMount, opts: { quotaChecked?: boolean } = {}): Promise<DataMount[]> {
  if (vol.project === null) {
    if (!opts.quotaChecked) await assertQuota(ctx, trx, box.project, { boxes: 0, cpus: 0, ram_mb: 0, storage_gb: vol.quota_gb, volumes: 1 });
    await volumesRepo.update(trx, vol.id, { project: box.project });
  }
  await volumesRepo.attach(trx, { volume_id: vol.id, box_id: box.id, project: box.project, box: box.name, path: mount.path, read_only: mount.read_only, created_at: now() });
  return [...box.data_mounts, { name: vol.name, path: mount.path, read_only: mount.read_only }];
}

