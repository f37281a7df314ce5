import { boxesRepo } from '../db/repos/boxes';
import { basesRepo } from '../db/repos/bases';
import { baseBuildsRepo, MAX_BUILD_LOG_BYTES } from '../db/repos/baseBuilds';
import { publicReason } from './publicReason';
import { recordBoxEvent } from './boxEvents';
import { baseJobs } from './baseJobs';
import { defineJob, JobRefused } from './types';

/**
 * A base build (docs/bases.md "Builds"), queued behind the create of its temporary box (same
 * turn key): the script runs as root in the box with its output logged as it comes; exit 0 saves
 * the box as `base@version` (as a save does) and the temporary box goes; anything else fails the
 * build, and the box and a base version this build reserved go. A retry after the script had
 * started runs it again in a fresh root from the parent, so a half-run script never reaches the
 * base. A forced rebuild destroys the old version only once its script succeeded, and only
 * while no box uses it.
 */
export const buildBaseJob = defineJob({
  type: baseJobs.build,
  async run({ payload, db, node, bases, operationId }) {
    const b = await baseBuildsRepo.get(db, payload.buildId);
    if (!b) throw new JobRefused('the build was forgotten before it ran');
    if (b.status === 'succeeded') return;
    let box = await boxesRepo.byId(db, payload.boxId);
    if (!box) {
      // Gone after the base was made (a worker died before the build was marked): done.
      if (b.script_done && (await basesRepo.get(db, payload.name, payload.version))) return void (await baseBuildsRepo.update(db, b.id, { status: 'succeeded', box_id: null, box: null }));
      throw new JobRefused('the temporary box of the build was deleted');
    }
    if (box.status !== 'running') throw new JobRefused(`the temporary box could not start from ${b.parent}${box.error ? `: ${box.error}` : ''}`);
    await baseBuildsRepo.update(db, b.id, { status: 'running', error: null });

    if (!b.script_done) {
      if (b.script_started) {
        // A worker died while the script ran: start again from the parent's files.
        const [name, version] = b.parent.split('@');
        await node.destroy(box);
        await node.createRoot(box, { kind: 'base', base: { name, version } });
        await node.start(box);
        box = (await boxesRepo.byId(db, box.id)) ?? box; // its address may be new
        await baseBuildsRepo.clearLog(db, b.id);
        await baseBuildsRepo.update(db, b.id, { log_bytes: 0 });
      }
      await baseBuildsRepo.update(db, b.id, { script_started: true });
      const { exitCode, timedOut } = await bases.runScript(box, b.script, (text) => baseBuildsRepo.appendLog(db, b.id, text), MAX_BUILD_LOG_BYTES);
      await baseBuildsRepo.update(db, b.id, { exit_code: exitCode });
      if (timedOut) throw new JobRefused('the build script timed out (BOXHOST_BUILD_TIMEOUT_SECS)');
      if (exitCode !== 0) throw new JobRefused(`the build script exited ${exitCode}`);
      await baseBuildsRepo.update(db, b.id, { script_done: true });
    }

    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (!row) throw new JobRefused(`base ${payload.name}@${payload.version} was deleted while it was being built`);
    if (b.force && !b.replaced && row.state === 'ready') {
      // Checked again now: a box made from the version while the script ran keeps it.
      const users = await boxesRepo.countByBase(db, [`${payload.name}@${payload.version}`]);
      if (users > 0) throw new JobRefused(`base ${payload.name}@${payload.version} is in use by ${users} box(es) made while it was rebuilt; it was kept`);
      if (row.node && row.node !== box.node) throw new JobRefused(`base ${payload.name}@${payload.version} is on node ${row.node}, the build ran on ${box.node}; it was kept`);
      await bases.destroy(payload);
      await basesRepo.update(db, payload.name, payload.version, { state: 'making' });
      await baseBuildsRepo.update(db, b.id, { replaced: true });
    }
    if ((await basesRepo.getAny(db, payload.name, payload.version))?.state !== 'ready') {
      const size = await bases.saveFromBox(box, payload);
      // The base is where its dataset is: the temporary box's node.
      await basesRepo.update(db, payload.name, payload.version, { node: box.node });
      await basesRepo.markReady(db, payload.name, payload.version, size);
    }
    await node.destroy(box);
    await boxesRepo.remove(db, box.id);
    await recordBoxEvent(db, box, 'box.deleted', { operationId });
    await baseBuildsRepo.update(db, b.id, { status: 'succeeded', box_id: null, box: null });
  },
  async onFailed({ payload, db, node, bases, operationId }, error) {
    const b = await baseBuildsRepo.get(db, payload.buildId);
    const failures: unknown[] = [];
    const step = async (fn: () => Promise<unknown>) => fn().catch((e: unknown) => void failures.push(e));
    // What this build reserved or destroyed goes (never another build's or save's version).
    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (row?.state === 'making' && (b?.reserved || b?.replaced)) {
      await step(() => bases.abandonSave(payload.boxId, payload));
      await step(() => basesRepo.dropMaking(db, payload.name, payload.version));
    }
    const box = await boxesRepo.byId(db, payload.boxId);
    if (box) {
      await step(async () => {
        await node.destroy(box);
        await boxesRepo.remove(db, box.id);
        await recordBoxEvent(db, box, 'box.deleted', { operationId });
      });
      // Left for its user to delete rather than shown running.
      if (failures.length) await step(() => boxesRepo.update(db, box.id, { status: 'failed', error: 'the base build it was made for failed; delete it' }));
    }
    await baseBuildsRepo.update(db, payload.buildId, { status: 'failed', error: publicReason(error), box_id: null, box: null });
  },
});
