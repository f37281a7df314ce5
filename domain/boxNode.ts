import type { DomainContext, Identity } from './context';
import type { NodeClient } from '../cluster/types';
import type { BoxRecord } from '../db/repos/boxes';
import { canExec } from '../core/box';
import { conflict } from '../core/errors';
import { loadBox } from './boxRef';

/**
 * A running box and its node, for a call into it (files, services): 404 for a box the caller
 * cannot see, 503 for a node that is down (whatever the row says), 409 for a box that is not
 * running (`what` says what needs it).
 */
export async function runningBox(ctx: DomainContext, identity: Identity, project: string, name: string, what: string): Promise<{ box: BoxRecord; id: string; node: NodeClient }> {
  const box = await loadBox(ctx, identity, project, name);
  const node = await ctx.nodes.client(box.node);
  if (!canExec(box.status)) throw conflict(`box ${project}/${name} is ${box.status}; ${what} need it running`);
  return { box, id: box.id, node };
}
