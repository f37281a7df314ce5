import { BoxAgentUnavailableError, BoxFileError, BoxServiceError, ExecInputError } from '../../errors';
import { BoxdProtocolError, Frame, textField } from './protocol';

/** How boxd's answers and a connection's failures read as the drivers' errors (workers/errors.ts),
 *  for the client's requests and its exec sessions alike. */

/** The largest pid a Linux pid namespace hands out. */
export const MAX_PID = 4_194_304;

/** A connection to boxd failed before it was made (no socket, nobody listening). */
export class BoxdUnreachableError extends BoxAgentUnavailableError {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

/** A socket error: before the connection was made boxd is unreachable (the box may not run);
 *  after, the agent failed mid-way. */
export function connectionError(connected: boolean, e: NodeJS.ErrnoException): Error {
  if (connected) return new BoxAgentUnavailableError(`boxd connection failed: ${e.code ?? e.message}`);
  return new BoxdUnreachableError(`boxd cannot be reached (${e.code ?? e.message})`, e.code ?? 'EUNKNOWN');
}

export function asAgentError(e: unknown): Error {
  if (e instanceof BoxdProtocolError) return new BoxAgentUnavailableError(`boxd broke the protocol: ${e.message}`);
  return e instanceof Error ? e : new Error(String(e));
}

/** The request a connection's first frame names. */
export function requestOf(first: Buffer): string {
  return String.fromCharCode(first[0]);
}

/** A failure frame as the error the drivers share. */
export function failure(o: Record<string, unknown>, request: string): Error {
  const message = textField(o, 'message');
  const service = request === Frame.service;
  const execField = ['command', 'cwd', 'env', 'user', 'timeout'].includes(String(o.field)) ? (o.field as ExecInputError['field']) : null;
  switch (o.kind) {
    case 'cwd':
      return new ExecInputError(message || 'the working directory cannot be entered', 'cwd');
    case 'not_found':
      if (service) return new BoxServiceError('not_found', message || 'no such service', 'name');
      return new BoxFileError(o.kind, message || String(o.kind));
    case 'exists':
    case 'busy':
    case 'permission':
    case 'invalid':
    case 'no_space':
      return new BoxFileError(o.kind, message || String(o.kind));
    case 'conflict':
      if (service) return new BoxServiceError('conflict', message || 'conflict', textField(o, 'field', 64));
      break;
    case 'input':
      if (o.field === 'path' || o.field === 'mode') return new BoxFileError('input', message || 'invalid file request');
      // A service's user, cwd and command fail as an exec's would; its other fields are its own.
      if (service && !execField) return new BoxServiceError('input', message || 'invalid service request', textField(o, 'field', 64));
      return new ExecInputError(message || 'invalid exec request', execField ?? 'command');
  }
  return new BoxAgentUnavailableError(`boxd could not serve the request: ${message || String(o.kind)}`);
}
