/**
 * The raw tools' own growth at scale: the same storage and container work a create does (`zfs
 * clone` with the box's properties, the nosuid,nodev remount, `runc run -d` in the project's
 * user namespace mapping; no api, queue or network), CREATE_CONCURRENCY at a time as the api's
 * creates go, measured once the first batch of boxes runs and again with all of them. What the
 * floor itself grows by is the part of the create figure's growth that is the tools' and the
 * storage daemon's, not boxhost's.
 */
import type { Host } from '../../server/host';
import type { ZfsStorage } from '../../workers/storage/zfs';
import { boxStorageWork, busyboxFloorBase, RawCreateSample, RawRunner } from '../raw';
import { summaryJson } from '../report';
import { summarize } from '../stats';
import { CREATE_CONCURRENCY } from './shape';

/** Rounds of CREATE_CONCURRENCY creates, each round removed before the next (the clones stay
 *  within the node's spare filesystems). */
const ROUNDS = 2;

export interface RawFloor {
  boxes: number;
  total: ReturnType<typeof summaryJson>;
  clone: ReturnType<typeof summaryJson>;
  run: ReturnType<typeof summaryJson>;
}

export async function rawFloorAt(opts: { host: Host; project: string; boxes: number; label: string; problems: string[] }): Promise<RawFloor> {
  const { host, problems } = opts;
  const storage = host.node!.ctx.storage as ZfsStorage;
  const { idMap, shiftedSnapshot: baseSnapshot } = await busyboxFloorBase(host.db, storage.root, opts.project);
  const samples: RawCreateSample[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const raw = new RawRunner({
      dataDir: host.config.dataDir,
      hostTag: host.config.hostTag,
      zfsRoot: storage.root,
      baseSnapshot,
      idMap,
      name: `floor${opts.label}${round}`,
      sameStorageWork: boxStorageWork(1),
    });
    await raw.prepare();
    // Every create settles before the cleanup (one failing must not leave the others starting
    // under it); the first failure is thrown after.
    const settled = await Promise.allSettled(Array.from({ length: CREATE_CONCURRENCY }, (_, i) => raw.createAndRun(i)));
    const left = (await raw.cleanup()).map((p) => `raw floor: ${p}`);
    problems.push(...left);
    for (const r of settled) if (r.status === 'fulfilled') samples.push(r.value);
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    // Whatever could not be removed holds filesystems of the node's spare: no more rounds.
    if (left.length) throw new Error(`round ${round} left what it made (${left.length} problems)`);
  }
  const of = (f: (s: RawCreateSample) => number) => summaryJson(summarize(samples.map(f)));
  return { boxes: opts.boxes, total: of((s) => s.totalMs), clone: of((s) => s.cloneMs), run: of((s) => s.runMs) };
}
