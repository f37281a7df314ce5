import Joi from 'joi';
import type { Db } from '../db/knex';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import type { BoxHost } from './ports';
import { packsRepo } from '../db/repos/packs';
import type { PackRevisionSpec } from '../core/apiTypes';
import { BoxhostError } from '../core/errors';
import { defineJob, jobType, JobRefused } from './types';
import { namesSecret, renderOwn } from './outputs';
import type { BoxRef } from './boxJobs';

/** The job of a pack instance's services, queued behind its create (docs/packs.md "Instances"). */
export const packJobs = {
  services: jobType<BoxRef>('pack.services', Joi.object<BoxRef>({ boxId: Joi.string().pattern(/^[a-z0-9]{1,32}$/).required() })),
};

/**
 * Starts the services of the revision an instance pinned, in the order the manifest lists them,
 * each through its ready gate (the instance is ready when the last gate passed), on the box's
 * node by its boxd, as the service start route does. Idempotent: a start replaces a service of
 * the same name. A service the box refuses (a gate that fails, a user or cwd it does not have)
 * ends the job with why; the box keeps running with what did start.
 */
export const packServicesJob = defineJob({
  type: packJobs.services,
  async run({ payload, db, node, progress }) {
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) return; // deleted before its services' turn
    await assertCreated(db, box, 'its services were not started');
    await startPackServices(db, node, box, progress);
  },
});

/** The gate a deploy gives a published service that has none (docs/packs.md). */
const DEFAULT_GATE_SECS = 30;

/**
 * A job queued behind a create runs after it: a box still `creating` lost its create
 * (reconciliation failed the operation and skipped the box while this one was queued) and is
 * failed here; any box not running refuses the job (`what` says what was not done).
 */
export async function assertCreated(db: Db, box: BoxRecord, what: string): Promise<void> {
  if (box.status === 'creating') {
    await db('boxes').where({ id: box.id, status: 'creating' }).update({ status: 'failed', error: 'create failed: its operation was lost', updated_at: new Date().toISOString() });
    throw new JobRefused(`box ${box.project}/${box.name} lost its create: ${what}`);
  }
  if (box.status !== 'running') throw new JobRefused(`box ${box.project}/${box.name} is ${box.status}${box.error ? ` (${box.error})` : ''}: ${what}`);
}

/** Starts the services of the revision `box` pinned, in the manifest's order, each through its
 *  ready gate; a refusal (a gate that fails, a user or cwd the box lacks) is the job's JobRefused. */
export async function startPackServices(db: Db, node: BoxHost, box: BoxRecord, progress: (percent: number) => Promise<void>, opts: { gatePublished?: boolean } = {}): Promise<void> {
  if (!box.pack || !box.pack_rev) return;
  const rev = await packsRepo.revision(db, box.pack, box.pack_rev);
  if (!rev) throw new JobRefused(`revision ${box.pack_rev} of pack ${box.pack} is gone`);
  const services = (JSON.parse(rev.content) as PackRevisionSpec).services ?? [];
  for (const [i, declared] of services.entries()) {
    const gated = opts.gatePublished && declared.publish && declared.port && !declared.ready;
    const gate = gated ? { ready: { tcp: declared.port!, timeout_secs: DEFAULT_GATE_SECS } } : {};
    // Its env may name the instance's own outputs' values ({{secret.password}}, {{port.web}}).
    // A variable that holds a secret is redacted in commands.start as secret_env ones are.
    const secret = Object.entries(declared.env ?? {}).filter(([, v]) => namesSecret(v)).map(([k]) => k);
    const env = declared.env ? { env: await renderOwn(db, box, { proxyPort: 0 }, declared.env) } : {};
    const redacted = secret.length > 0 ? { secret_env: [...new Set([...(declared.secret_env ?? []), ...secret])] } : {};
    const spec = { ...declared, ...gate, ...env, ...redacted };
    try {
      await node.startService(box, spec);
    } catch (e) {
      if (e instanceof BoxhostError && e.code !== 'internal' && e.code !== 'unavailable') throw new JobRefused(`service ${spec.name}: ${e.message}`);
      throw e;
    }
    await progress(Math.round(((i + 1) / services.length) * 100));
  }
}
