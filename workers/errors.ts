/**
 * Errors the host drivers share (any backend throws these, `workers/agent/localNode.ts` turns
 * them into the contract's codes). Anything else a driver throws is an internal failure.
 */

/** The caller asked for something the box cannot do (bad cwd, unknown user, …): 400. */
export class ExecInputError extends Error {
  override name = 'ExecInputError';
  /** The exec option at fault: command, cwd, env, user or timeout. */
  constructor(message: string, readonly field: 'command' | 'cwd' | 'env' | 'user' | 'timeout' = 'command') {
    super(message);
  }
}

/** The container does not exist or is not running (exec into it is impossible): 409. */
export class BoxNotRunningError extends Error {
  override name = 'BoxNotRunningError';
}

/** The box runs but its agent (boxd) does not answer, or broke the protocol: 503. */
export class BoxAgentUnavailableError extends Error {
  override name = 'BoxAgentUnavailableError';
}

/** The box runs an init from before boxd (it predates the agent): what needs boxd waits for
 *  the box's next start. 409. */
export class BoxNeedsRestartError extends Error {
  override name = 'BoxNeedsRestartError';
}

/** A service call boxd refused: `input` (a field of the spec: 400), `not_found` (404),
 *  `conflict` (the box is stopping: 409). */
export class BoxServiceError extends Error {
  override name = 'BoxServiceError';
  constructor(
    readonly kind: 'input' | 'not_found' | 'conflict',
    message: string,
    readonly field = '',
  ) {
    super(message);
  }
}

/** A file operation in a box failed: `not_found` (404), `exists` and `busy` (409: a mount point
 *  in use), `permission` (403), `invalid` / `input` (400: a directory where a file was wanted, a
 *  path that is not absolute), `no_space` (507). */
export class BoxFileError extends Error {
  override name = 'BoxFileError';
  constructor(
    readonly kind: 'not_found' | 'exists' | 'busy' | 'permission' | 'invalid' | 'input' | 'no_space',
    message: string,
  ) {
    super(message);
  }
}
