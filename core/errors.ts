/**
 * The errors of the contract (DESIGN.md §3): every layer throws these with a code; the HTTP
 * servers (the api, the node agent) answer `statusOf(code)` with the body
 * `{"error": {code, message, details}}`.
 */
export interface ErrorDetail {
  field: string;
  issue: string;
}

export type ErrorCode =
  | 'invalid_argument' | 'unauthenticated' | 'permission_denied' | 'not_found' | 'conflict'
  | 'payload_too_large' | 'rate_limited' | 'timeout' | 'internal' | 'unavailable' | 'not_ready'
  | 'insufficient_storage';

const STATUS: Record<ErrorCode, number> = {
  invalid_argument: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  timeout: 408,
  conflict: 409,
  not_ready: 409,
  payload_too_large: 413,
  rate_limited: 429,
  internal: 500,
  unavailable: 503,
  insufficient_storage: 507,
};

export const statusOf = (code: ErrorCode) => STATUS[code];

export class BoxhostError extends Error {
  override name = 'BoxhostError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: ErrorDetail[] = [],
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }

  toBody() {
    return { error: { code: this.code, message: this.message, details: this.details } };
  }
}

export const invalid = (message: string, details: ErrorDetail[] = []) => new BoxhostError('invalid_argument', message, details);
export const invalidField = (field: string, issue: string) => invalid(`${field}: ${issue}`, [{ field, issue }]);
/** 401 says how to authenticate (RFC 9110 §11.6.1: a 401 carries WWW-Authenticate). */
export const unauthenticated = (message = 'a valid bearer token is required') => new BoxhostError('unauthenticated', message, [], { 'WWW-Authenticate': 'Bearer realm="boxhost"' });
export const forbidden = (message: string) => new BoxhostError('permission_denied', message);
export const notFound = (what: string) => new BoxhostError('not_found', `${what} not found`);
export const conflict = (message: string) => new BoxhostError('conflict', message);
export const unavailable = (message: string) => new BoxhostError('unavailable', message);
export const timeoutError = (message: string) => new BoxhostError('timeout', message);
