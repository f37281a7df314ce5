import type { DomainContext, Identity } from './context';
import { conflict } from '../core/errors';
import { canExec } from '../core/box';
import type { ExecResult } from '../core/apiTypes';
import { loadBox } from './boxes';

export interface ExecRequest {
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
  no_hup?: boolean;
  shell?: boolean;
  tty?: boolean;
  user?: string;
  timeout_secs?: number;
}

export const DEFAULT_EXEC_TIMEOUT_SECS = 300;

/** DESIGN.md §4 exec: synchronous, through the box's node (in-process or its agent). */
export async function execInBox(ctx: DomainContext, identity: Identity, project: string, name: string, req: ExecRequest): Promise<ExecResult> {
  const box = await loadBox(ctx, identity, project, name);
  // The node first: a box on a node that is down is `unknown`, whatever its row says (503).
  const node = await ctx.nodes.client(box.node);
  if (!canExec(box.status)) throw conflict(`box ${project}/${name} is ${box.status}; exec needs it running`);
  const r = await node.exec(box.id, {
    command: req.shell ? ['/bin/sh', '-c', req.command.join(' ')] : req.command,
    cwd: req.cwd,
    // The box-level environment is the base; the request's env wins over it.
    env: { ...box.environment, ...(req.env ?? {}) },
    user: req.user,
    tty: req.tty,
    detach: req.no_hup,
    timeoutMs: (req.timeout_secs ?? DEFAULT_EXEC_TIMEOUT_SECS) * 1000,
  });
  return { detached: r.detached, exit_code: r.exitCode, process: r.pid, stdout: r.stdout, stderr: r.stderr, truncated: r.truncated };
}
