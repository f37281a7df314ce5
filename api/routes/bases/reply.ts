import type { Accepted } from '../../../domain/operations';
import type { Base } from '../../../core/apiTypes';
import { BoxhostError } from '../../../core/errors';
import type { ApiContext } from '../../context';
import { acceptedReply } from '../../http/operation';
import type { Reply } from '../../http/route';

/**
 * A save or import answered as every job-backed route is (202, or 200 with `?wait`), except that
 * a job that failed within the wait leaves no base to show: its error is the answer (409 when it
 * was refused, as a save of a box deleted meanwhile; 500 otherwise), with the operation headers.
 */
export async function baseReply(api: ApiContext, accepted: Accepted<Base>, wait: number | undefined, what: string): Promise<Reply> {
  const reply = await acceptedReply(api, accepted, wait);
  if (reply.status !== 204) return reply;
  const op = await api.queue.waitFor(accepted.operation.id, 0);
  // Succeeded, and the version deleted since: nothing to show, as for any resource gone.
  if (op?.status !== 'failed') return reply;
  const refused = /deleted before|can be saved as a base when/.test(op?.error ?? '');
  throw new BoxhostError(refused ? 'conflict' : 'internal', `the ${what} failed: ${op?.error ?? 'its operation failed'} (operation ${accepted.operation.id})`, [], reply.headers as Record<string, string>);
}
