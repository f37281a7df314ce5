import type { DomainContext, Identity } from './context';
import type { Box, PackRevisionSpec } from '../core/apiTypes';
import { conflict, forbidden, invalidField } from '../core/errors';
import { now } from '../core/ids';
import { NAME_PATTERN } from '../core/names';
import type { Db } from '../db/knex';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { deploysRepo, type DeployLineRow } from '../db/repos/deploys';
import { operationsRepo, isFinished, type OperationRow } from '../db/repos/operations';
import { outputsRepo, secretOwner } from '../db/repos/outputs';
import { boxJobs } from '../jobs/boxJobs';
import { deployJobs, type PlannedPublish, type RetirePayload } from '../jobs/packDeploy';
import { enqueueBoxJob, pendingActions, reload } from './boxes';
import { loadBox } from './boxRef';
import { projectedStatus } from '../core/box';
import { createInstance } from './instances';
import { pinnedRevision, revisionNamed } from './packs';
import { checkPublishName } from '../core/services';
import { publishRowOf } from './publishView';
import type { Accepted } from './operations';

/**
 * Deploy generations (docs/packs.md "Deploy generations"). A line is an instance and the boxes
 * deployed after it; it keeps the instance's name, and its publishes keep their host names
 * (`<publish>--<line>--<project>`) whichever generation serves them. A deploy makes generation N
 * (`<line>-g<N>`, `lifecycle: deploy`, pinned to a revision, `rollback_to` the live one), starts
 * its services through their ready gates, then moves the publishes to it in one transaction
 * (jobs/packDeploy.ts); the generation it replaced keeps serving for the drain time and is then
 * stopped, kept for a rollback; older generations are deleted. A rollback resumes the generation
 * the live one names in `rollback_to` and switches back the same way.
 */

/** Who may deploy: a token without a project limit, or one with the `deploy` scope (a project
 *  token reaches only its projects: loadBox answers 404 elsewhere). */
function assertMayDeploy(identity: Identity, project: string): void {
  if (identity.projects === null) return;
  if (!identity.scopes?.includes('deploy')) throw forbidden(`deploying needs a token with the deploy scope (project ${project})`);
}

/** The line of a box: the one it is a generation of, or the one it would start (its own name). */
async function lineOf(db: Db, box: BoxRecord): Promise<{ name: string; row: DeployLineRow | undefined }> {
  const gen = await deploysRepo.generationOf(db, box.id);
  if (gen) return { name: gen.line, row: await deploysRepo.line(db, box.project, gen.line) };
  // A line outlives the box it was named after (deleted while another generation was live):
  // a new box of that name is not of it.
  if (await deploysRepo.line(db, box.project, box.name)) throw conflict(`box ${box.project}/${box.name} is not of deploy line ${box.name}, whose name it took; deploy the line through its live box`);
  return { name: box.name, row: undefined };
}

/** 409 while a deploy or rollback of the line is under way. */
async function assertIdle(db: Db, line: string, row: DeployLineRow | undefined): Promise<void> {
  if (!row?.deploy_op) return;
  const op = await operationsRepo.get(db, row.deploy_op);
  if (op && !isFinished(op.status)) throw conflict(`line ${line} is being deployed (operation ${op.id}); wait for it`);
}

/** The publishes of a revision's services, under the line's host names. */
function planPublishes(ctx: DomainContext, project: string, line: string, spec: PackRevisionSpec): PlannedPublish[] {
  return (spec.services ?? []).filter((s) => s.publish).map((s) => publishRowOf(ctx.config, line, project, { name: checkPublishName(s.publish!.name ?? s.name, 'pack'), port: s.port!, public: s.publish!.public, service: s.name }));
}

const retire = (ctx: DomainContext, trx: Db, identity: Identity, box: BoxRecord, p: Omit<RetirePayload, 'boxId' | 'drainMs'>) =>
  enqueueBoxJob(ctx, trx, box, deployJobs.retire.of({ boxId: box.id, drainMs: ctx.config.deployDrainSecs * 1000, ...p }), identity);

/** `POST …/boxes/{name}/deploy`: a new generation of the line `name` belongs to. */
export async function deployInstance(ctx: DomainContext, identity: Identity, project: string, name: string, req: { rev?: string }): Promise<Accepted<Box>> {
  const named = await loadBox(ctx, identity, project, name);
  assertMayDeploy(identity, project);
  const { name: line, row } = await lineOf(ctx.db, named);
  await assertIdle(ctx.db, line, row);
  const live = row ? await boxesRepo.byId(ctx.db, row.live_box_id) : named;
  if (!live) throw conflict(`line ${line} has no live generation`);
  if (!live.pack || !live.pack_rev) throw conflict(`box ${project}/${name} is not a pack instance: only instances are deployed`);
  if (live.lifecycle === 'dev') throw conflict(`box ${project}/${live.name} is a dev instance: deploy an instance made without lifecycle`);
  if (live.data_mounts.length > 0) throw conflict(`box ${project}/${live.name} has data volumes; a deploy generation does not take them over`);
  if (live.status === 'deleting' || live.status === 'creating') throw conflict(`box ${project}/${live.name} is ${live.status}`);
  const revision = await revisionNamed(ctx, live.pack, req.rev);
  // A box left with a generation's name (a line that ended) is stepped over.
  let generation = (row?.generation ?? 1) + 1;
  while (generation < (row?.generation ?? 1) + 100 && (await boxesRepo.get(ctx.db, project, `${line}-g${generation}`))) generation++;
  const genName = `${line}-g${generation}`;
  if (!NAME_PATTERN.test(genName)) throw conflict(`the generation's name ${genName} breaks the name rule: the line's name is too long to deploy`);
  const publishes = planPublishes(ctx, project, line, revision.spec);

  const followUp = async (trx: Db, box: BoxRecord): Promise<OperationRow> => {
    const at = now();
    let locked = await deploysRepo.lockLine(trx, project, line);
    if (!locked) {
      await deploysRepo.insertLine(trx, { project, line, live_box_id: live.id, generation: 1, deploy_op: null, switched_at: null, switched_by: null, created_at: at, updated_at: at });
      await deploysRepo.insertGeneration(trx, { box_id: live.id, project, line, generation: 1 });
      // Secrets are the line's from now on: every generation's services and every consumer
      // share those its first box made.
      await outputsRepo.copySecrets(trx, live.id, secretOwner(project, line));
      locked = (await deploysRepo.lockLine(trx, project, line))!;
    }
    if (locked.live_box_id !== live.id || locked.generation !== (row?.generation ?? 1)) throw conflict(`line ${line} was deployed meanwhile; deploy again`);
    await assertIdle(trx, line, locked);
    await deploysRepo.insertGeneration(trx, { box_id: box.id, project, line, generation });
    const op = await enqueueBoxJob(ctx, trx, box, deployJobs.deploy.of({ boxId: box.id, project, line, publishes, rollback: false }), identity);
    await deploysRepo.updateLine(trx, project, line, { deploy_op: op.id, generation });
    await retire(ctx, trx, identity, live, { deployOp: op.id, when: 'switched', action: 'stop' });
    // Every other generation goes once this one is live: the line keeps the live one and the one
    // it rolls back to.
    for (const g of await deploysRepo.generations(trx, project, line)) {
      if (g.box_id === live.id || g.box_id === box.id) continue;
      const old = await boxesRepo.byId(trx, g.box_id);
      if (old && old.status !== 'deleting') await retire(ctx, trx, identity, old, { deployOp: op.id, when: 'switched', action: 'delete' });
    }
    await retire(ctx, trx, identity, box, { deployOp: op.id, when: 'failed', action: 'stop' });
    return op;
  };

  // Its env_from links go with it, rendered again at its starts as the live box's are.
  const envLinks = (await outputsRepo.links(ctx.db, live.id)).map(({ box_id: _, ...l }) => l);
  return createInstance(ctx, identity, project, {
    name: genName,
    config: live.config,
    environment: live.environment,
    tags: live.tags,
    envLinks,
  }, live.pack, revision, { lifecycle: 'deploy', rollbackTo: live.name, followUp });
}

/** `POST …/boxes/{name}/rollback`: the line goes back to the generation its live one names. */
export async function rollbackInstance(ctx: DomainContext, identity: Identity, project: string, name: string): Promise<Accepted<Box>> {
  const named = await loadBox(ctx, identity, project, name);
  assertMayDeploy(identity, project);
  const { name: line, row } = await lineOf(ctx.db, named);
  if (!row) throw conflict(`box ${project}/${name} has never been deployed: there is nothing to roll back to`);
  await assertIdle(ctx.db, line, row);
  const live = await boxesRepo.byId(ctx.db, row.live_box_id);
  if (!live?.rollback_to) throw conflict(`line ${line} has no earlier generation to roll back to`);
  const target = await boxesRepo.get(ctx.db, project, live.rollback_to);
  const gen = target ? await deploysRepo.generationOf(ctx.db, target.id) : undefined;
  if (!target || gen?.line !== line) throw conflict(`generation ${live.rollback_to} of line ${line} is gone; deploy instead`);
  // `stopping`: retired after its drain (jobs/packDeploy.ts), resumed behind that stop.
  if (target.status !== 'stopped' && target.status !== 'running' && target.status !== 'stopping') throw conflict(`generation ${target.name} is ${target.status}; it cannot take the line back`);
  if (!target.pack || !target.pack_rev) throw conflict(`generation ${target.name} is not a pack instance`);
  await ctx.nodes.assertUp(target.node);
  const publishes = planPublishes(ctx, project, line, await pinnedRevision(ctx, target.pack, target.pack_rev));

  const operation = await ctx.db.transaction(async (trx) => {
    const locked = await deploysRepo.lockLine(trx, project, line);
    if (!locked || locked.live_box_id !== live.id) throw conflict(`line ${line} was deployed meanwhile; roll back again`);
    await assertIdle(trx, line, locked);
    const box = await boxesRepo.byId(trx, target.id, { lock: true });
    if (!box || (box.status !== 'stopped' && box.status !== 'running' && box.status !== 'stopping')) throw conflict(`generation ${target.name} changed meanwhile; roll back again`);
    // What is queued on it (a user's stop) counts: it is resumed if it will be stopped by then;
    // so is one its retire is stopping now (that stop is no box action of its own).
    const pending = await pendingActions(trx, box.id);
    if (box.status === 'stopping' || projectedStatus(box.status, pending) === 'stopped') {
      if ((await operationsRepo.unfinishedForBox(trx, box.id)).length === 0) await boxesRepo.update(trx, box.id, { status: 'resuming', error: null });
      await enqueueBoxJob(ctx, trx, box, boxJobs.resume.of({ boxId: box.id }), identity);
    }
    const op = await enqueueBoxJob(ctx, trx, box, deployJobs.deploy.of({ boxId: box.id, project, line, publishes, rollback: true }), identity);
    await deploysRepo.updateLine(trx, project, line, { deploy_op: op.id });
    await retire(ctx, trx, identity, live, { deployOp: op.id, when: 'switched', action: 'stop' });
    await retire(ctx, trx, identity, box, { deployOp: op.id, when: 'failed', action: 'stop' });
    return op;
  });
  return { operation, load: reload(ctx, target.id) };
}
