import type { WorkerContext } from '../context';
import { basesRepo } from '../../db/repos/bases';
import { busyboxVersion, fillBusyboxRootfs } from './busyboxRootfs';

export const BUSYBOX_BASE = 'busybox';

/** A fresh host has a base `busybox` made from the host's busybox-static (no download). */
export async function ensureDefaultBase(ctx: WorkerContext): Promise<void> {
  const ref = { name: BUSYBOX_BASE, version: await busyboxVersion() };
  if (!(await ctx.storage.hasBase(ref))) {
    ctx.log.info(ref, 'making the default base');
    await ctx.storage.createBase(ref, fillBusyboxRootfs);
  }
  await basesRepo.ensure(ctx.db, { ...ref, size_bytes: await ctx.storage.baseSizeBytes(ref) });
}
