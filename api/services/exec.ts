import type { ApiContext, Identity } from '../context';
import { conflict, invalid } from '../http/errors';
import { loadBox } from './boxes';
import { BoxNotRunningError, ExecInputError } from '../../workers/runtime/runc';

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

/** DESIGN.md §4 exec: synchronous, straight against the running container. */
export async function execInBox(api: ApiContext, identity: Identity, project: string, name: string, req: ExecRequest) {
  const box = await loadBox(api.db, identity, project, name);
  if (box.status !== 'running') throw conflict(`box ${project}/${name} is ${box.status}; exec needs it running`);
  const command = req.shell ? ['/bin/sh', '-c', req.command.join(' ')] : req.command;
  try {
    const r = await api.runtime.exec(box.id, {
      command,
      cwd: req.cwd,
      // The box-level environment is the base; the request's env wins over it.
      env: { ...box.environment, ...(req.env ?? {}) },
      user: req.user,
      tty: req.tty,
      detach: req.no_hup,
      timeoutMs: (req.timeout_secs ?? DEFAULT_EXEC_TIMEOUT_SECS) * 1000,
    });
    return { detached: r.detached, exit_code: r.exitCode, process: r.pid, stdout: r.stdout, stderr: r.stderr, truncated: r.truncated };
  } catch (e) {
    if (e instanceof ExecInputError) throw invalid(e.message, [{ field: e.field === 'timeout' ? 'timeout_secs' : e.field, issue: e.message }]);
    if (e instanceof BoxNotRunningError) throw conflict(`box ${project}/${name} is not running`);
    throw e;
  }
}
