/** The error contract of DESIGN.md §3: `{"error": {code, message, details}}` with a precise status. */
export interface ErrorDetail {
  field: string;
  issue: string;
}

export type ErrorCode =
  | 'invalid_argument' | 'unauthenticated' | 'permission_denied' | 'not_found' | 'conflict'
  | 'payload_too_large' | 'rate_limited' | 'timeout' | 'internal' | 'unavailable' | 'not_ready';

export class ApiError extends Error {
  constructor(
    readonly status: number,
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

export const invalid = (message: string, details: ErrorDetail[] = []) => new ApiError(400, 'invalid_argument', message, details);
export const invalidField = (field: string, issue: string) => invalid(`${field}: ${issue}`, [{ field, issue }]);
export const unauthenticated = (message = 'a valid bearer token is required') => new ApiError(401, 'unauthenticated', message);
export const forbidden = (message: string) => new ApiError(403, 'permission_denied', message);
export const notFound = (what: string) => new ApiError(404, 'not_found', `${what} not found`);
export const conflict = (message: string) => new ApiError(409, 'conflict', message);
export const unavailable = (message: string) => new ApiError(503, 'unavailable', message);
