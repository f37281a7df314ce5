import type { Db } from '../db/knex';
import type { BoxRecord } from '../db/repos/boxes';
import type { BoxEvent } from '../core/apiTypes';
import { eventsRepo } from '../db/repos/events';
import { operationsRepo } from '../db/repos/operations';
import { newId, now } from '../core/ids';

/**
 * Records a box's lifecycle transition as an event (docs/packs.md "Events"), beside the verb
 * runs, so a stream of a project shows both: who asked (the operation's token), how long it took
 * from the request. Best effort: a transition that happened is never undone for its event.
 */
export async function recordBoxEvent(
  db: Db,
  box: Pick<BoxRecord, 'id' | 'project' | 'name' | 'pack' | 'pack_rev'>,
  kind: BoxEvent['kind'],
  opts: { operationId?: string; who?: string; error?: string; operation?: { created_by: string | null; created_at: string } } = {},
): Promise<void> {
  try {
    // The job's own row when it has it (one read fewer), else read.
    const op = opts.operation ?? (opts.operationId ? await operationsRepo.get(db, opts.operationId) : undefined);
    const ts = now();
    await eventsRepo.insert(db, {
      id: newId('ev'), ts, kind, project: box.project, box_name: box.name, box_id: box.id, pack: box.pack ?? '', rev: box.pack_rev ?? '', verb: '', args: '[]', env_set: '[]',
      who: opts.who ?? op?.created_by ?? 'boxhost', outcome: kind === 'box.failed' ? 'error' : 'success',
      duration_ms: op ? Math.max(0, Date.parse(ts) - Date.parse(op.created_at)) : 0, error: opts.error ?? null, exit_code: null,
    });
  } catch {
    // The event is lost, not the transition (the db answered the transition a moment ago).
  }
}
