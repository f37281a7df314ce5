import type { DomainContext, Identity } from './context';
import type WebSocket from 'ws';
import type { ExecSession, ExecSessionRequest } from '../cluster/types';
import { bridgeSession } from '../cluster/wsSession';

export type { ExecSession, ExecSessionRequest };

/** Relays a started session over the client's WebSocket (cluster/wsSession.ts). */
export const relaySession = (ws: WebSocket, session: ExecSession): void => bridgeSession(ws, session);
import { canExec } from '../core/box';
import { conflict } from '../core/errors';
import { loadBox } from './boxRef';
import type { ExecSlots } from './exec';

/**
 * Interactive sessions (WebSocket exec and console, DESIGN.md §4): the box's node starts the
 * process and relays it. A session holds an exec slot of its box and of its token for as long
 * as it runs (the same caps as HTTP exec).
 */
export async function openSession(ctx: DomainContext, identity: Identity, project: string, name: string, req: ExecSessionRequest, slots?: ExecSlots): Promise<ExecSession> {
  const box = await loadBox(ctx, identity, project, name);
  const node = await ctx.nodes.client(box.node);
  if (!canExec(box.status)) throw conflict(`box ${project}/${name} is ${box.status}; a session needs it running`);
  const release = slots ? await slots.acquire(box.id, identity.tokenId) : undefined;
  let session: ExecSession;
  try {
    // The box-level environment is the base; the request's wins.
    session = await node.execSession(box.id, { ...req, env: { ...box.environment, ...(req.env ?? {}) } });
  } catch (e) {
    await release?.();
    throw e;
  }
  session.exited.catch(() => undefined).finally(() => void release?.());
  return session;
}

/**
 * The console's command: the box user's login shell from the box's own /etc/passwd (`$SHELL`
 * there), else /bin/sh, on a terminal.
 */
export const CONSOLE_COMMAND = [
  '/bin/sh',
  '-c',
  'shell=$(while IFS=: read -r n x u g c h s; do [ "$u" = "$(id -u)" ] && { echo "$s"; break; }; done < /etc/passwd 2>/dev/null); case "$shell" in */nologin|*/false|"") shell=/bin/sh;; esac; [ -x "$shell" ] || shell=/bin/sh; export SHELL="$shell"; cd "${HOME:-/}" 2>/dev/null; exec "$shell" -l',
];
