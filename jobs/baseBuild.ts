import { boxesRepo } from '../db/repos/boxes';
import { basesRepo } from '../db/repos/bases';
import { baseBuildsRepo, MAX_BUILD_LOG_BYTES } from '../db/repos/baseBuilds';
import { publicReason } from './publicReason';
import { baseJobs } from './baseJobs';
import { defineJob, JobRefused } from './types';

/**
 * A base build (docs/bases.md "Builds"), queued behind the create of its temporary box (same
 * turn key): the script runs as root in the box with its output logged as it comes; exit 0 saves
 * the box as `base@version` (as a save does) and the temporary box goes; anything else fails the
 * build, and the box and the `making` base go. A retry after the script had started runs it again
 * in a fresh root from the parent, so a half-run script never reaches the base.
 */
export const buildBaseJob = defineJob({
  type: baseJobs.build,
  async run({ payload, db, node, bases }) {
    const b = await baseBuildsRepo.get(db, payload.buildId);
    if (!b) throw new JobRefused('the build was forgotten before it ran');
    if (b.status === 'succeeded') return;
    const box = await boxesRepo.byId(db, payload.boxId);
    if (!box) throw new JobRefused('the temporary box of the build was deleted');
    if (box.status !== 'running') throw new JobRefused(`the temporary box could not start from ${b.parent}${box.error ? `: ${box.error}` : ''}`);
    await baseBuildsRepo.update(db, b.id, { status: 'running', error: null });

    if (!b.script_done) {
      if (b.script_started) {
        // A worker died while the script ran: start again from the parent's files.
        const [name, version] = b.parent.split('@');
        await node.destroy(box);
        await node.createRoot(box, { kind: 'base', base: { name, version } });
        await node.start(box);
        await baseBuildsRepo.clearLog(db, b.id);
        await baseBuildsRepo.update(db, b.id, { log_bytes: 0 });
      }
      await baseBuildsRepo.update(db, b.id, { script_started: true });
      let logged = 0;
      let cut = false;
      const exit = await bases.runScript(box, b.script, async (text) => {
        if (cut) return;
        if (logged + Buffer.byteLength(text) > MAX_BUILD_LOG_BYTES) {
          cut = true;
          text = `${text.slice(0, Math.max(0, MAX_BUILD_LOG_BYTES - logged))}\n[the log was cut at ${MAX_BUILD_LOG_BYTES} bytes]\n`;
        }
        logged += Buffer.byteLength(text);
        await baseBuildsRepo.appendLog(db, b.id, text);
      });
      await baseBuildsRepo.update(db, b.id, { exit_code: exit });
      if (exit !== 0) throw new JobRefused(exit === 124 ? 'the build script timed out' : `the build script exited ${exit}`);
      await baseBuildsRepo.update(db, b.id, { script_done: true });
    }

    const row = await basesRepo.getAny(db, payload.name, payload.version);
    if (!row) throw new JobRefused(`base ${payload.name}@${payload.version} was deleted while it was being built`);
    if (row.state === 'ready' && b.force) {
      // A forced rebuild replaces the version (no box uses it: checked when it was asked for).
      await basesRepo.update(db, payload.name, payload.version, { state: 'making' });
      await bases.destroy(payload);
    }
    if ((await basesRepo.getAny(db, payload.name, payload.version))?.state !== 'ready') {
      const size = await bases.saveFromBox(box, payload);
      await basesRepo.markReady(db, payload.name, payload.version, size);
    }
    await node.destroy(box);
    await boxesRepo.remove(db, box.id);
    await baseBuildsRepo.update(db, b.id, { status: 'succeeded', box_id: null, box: null });
  },
  async onFailed({ payload, db, node, bases }, error) {
    const box = await boxesRepo.byId(db, payload.boxId);
    try {
      if (box) {
        await node.destroy(box);
        await boxesRepo.remove(db, box.id);
      }
      const row = await basesRepo.getAny(db, payload.name, payload.version);
      if (row?.state === 'making') {
        try {
          await bases.abandonSave(payload.boxId, payload);
        } finally {
          await basesRepo.dropMaking(db, payload.name, payload.version);
        }
      }
    } finally {
      await baseBuildsRepo.update(db, payload.buildId, { status: 'failed', error: publicReason(error), box_id: null, box: null });
    }
  },
});
