import type { DomainContext, Identity } from './context';
import type { RunVerbRequest, VerbResult } from '../core/apiTypes';
import { BoxhostError, conflict, invalid, notFound } from '../core/errors';
import { newId, now } from '../core/ids';
import { eventsRepo } from '../db/repos/events';
import { loadBox } from './boxRef';
import { execInBox, type ExecOptions } from './exec';
import { pinnedRevision } from './packs';

/**
 * Runs a verb of a pack instance (docs/packs.md "Verbs"): the verb's command of the revision the
 * instance pinned, with `args` appended, and only the variables the verb declares in `env`
 * (others → 400, naming each). Every run that got as far as the verb records one event, also when
 * it could not run (`outcome: error`, the answer is then the error, naming the event); `env_set`
 * keeps the names, never the values.
 */
export async function runVerb(ctx: DomainContext, identity: Identity, project: string, name: string, verb: string, req: RunVerbRequest, opts: ExecOptions = {}): Promise<VerbResult> {
  const box = await loadBox(ctx, identity, project, name);
  if (!box.pack || !box.pack_rev) throw conflict(`box ${project}/${name} is not a pack instance: it has no verbs`);
  const spec = (await pinnedRevision(ctx, box.pack, box.pack_rev)).verbs?.[verb];
  if (!spec) throw notFound(`verb ${verb} of pack ${box.pack} (revision ${box.pack_rev})`);
  const env = req.env ?? {};
  const allowed = new Set(spec.env ?? []);
  const extra = Object.keys(env).filter((k) => !allowed.has(k));
  if (extra.length > 0) {
    throw invalid(`verb ${verb} does not take ${extra.join(', ')} (it declares ${[...allowed].join(', ') || 'no variables'})`, extra.map((k) => ({ field: `env.${k}`, issue: `not declared by verb ${verb}` })));
  }
  const args = req.args ?? [];
  const id = newId('ev');
  const ts = now();
  const started = Date.now();
  const record = (r: { outcome: 'success' | 'failure' | 'error'; exit_code?: number; error?: string }) =>
    eventsRepo.insert(ctx.db, {
      id, ts, kind: 'verb', project, box_name: name, box_id: box.id, pack: box.pack!, rev: box.pack_rev!, verb, args: JSON.stringify(args), env_set: JSON.stringify(Object.keys(env).sort()),
      who: identity.name, outcome: r.outcome, duration_ms: Date.now() - started, error: r.error ?? null, exit_code: r.exit_code ?? null,
    });
  let result;
  try {
    result = await execInBox(ctx, identity, project, name, { command: [...spec.command, ...args], env }, opts);
  } catch (e) {
    const err = e as Error;
    // Any token of the project reads events: what the caller was told, never the host's words.
    await record({ outcome: 'error', error: err instanceof BoxhostError && err.code !== 'internal' ? err.message : 'internal error: the run could not be made (the api logged why)' });
    if (err instanceof BoxhostError) throw new BoxhostError(err.code, `${err.message} (event ${id})`, err.details, err.headers);
    throw err;
  }
  await record({ outcome: result.exit_code === 0 ? 'success' : 'failure', exit_code: result.exit_code });
  return { ...result, event_id: id };
}
