import type { ErrorRequestHandler, RequestHandler } from 'express';
import { ValidationError } from 'joi';
import { QueueUnavailableError } from '../../jobs/queue';
import { isBusy } from '../../db/errors';
import { BoxhostError, ErrorCode, ErrorDetail, invalid, notFound, statusOf } from '../../core/errors';

/**
 * A contract error answered with another status than its code's: 415 for a body whose charset
 * or Content-Encoding the api does not take (HTTP says 415 for both; DESIGN.md §3 has no code
 * of its own for it, so the code stays `invalid_argument`: docs/decisions.md "Requests and
 * errors").
 */
export class StatusError extends BoxhostError {
  constructor(readonly httpStatus: number, code: ErrorCode, message: string, details: ErrorDetail[] = [], headers: Record<string, string> = {}) {
    super(code, message, details, headers);
  }
}

/**
 * A JSON body holding a string that is no Unicode text (a lone surrogate escape). Recognised by
 * its class: body-parser strips the own properties of whatever its parser throws.
 */
export class NotUnicodeError extends Error {
  override name = 'NotUnicodeError';
}

/** A JSON body with a key `__proto__`, which no field takes: `JSON.parse` makes it an own key,
 *  but `Object.assign` or a merge from it would set the target's prototype instead. Recognised
 *  by its class, as above. */
export class ProtoKeyError extends Error {
  override name = 'ProtoKeyError';
}

export const httpStatusOf = (e: BoxhostError) => (e instanceof StatusError ? e.httpStatus : statusOf(e.code));

/** Content codings the JSON parser undoes (body-parser's list). */
const CONTENT_CODINGS = 'identity, gzip, deflate, br';

/**
 * The client errors express, its router and body-parser raise (http-errors objects with a 4xx
 * `status` and a `type`) turned into the contract's. Anything they flag as the client's fault
 * must never come out as a 500: a truncated gzip body or a path with a stray `%` is bad input.
 */
function clientError(e: any): BoxhostError | undefined {
  const status = typeof e?.status === 'number' ? e.status : typeof e?.statusCode === 'number' ? e.statusCode : undefined;
  if (e instanceof URIError || (status === 400 && /^Failed to decode param/.test(String(e?.message)))) {
    return invalid('the path is not valid percent-encoding', [{ field: 'path', issue: 'is not valid percent-encoded UTF-8' }]);
  }
  if (status === undefined || status < 400 || status >= 500) return undefined;
  switch (e.type) {
    case 'entity.parse.failed':
      if (e instanceof ProtoKeyError) return invalid('the body holds a key named "__proto__", which no field takes', [{ field: 'body', issue: 'holds a key named __proto__' }]);
      if (e instanceof NotUnicodeError) return invalid('the body holds a string that is not valid Unicode (a lone surrogate)', [{ field: 'body', issue: 'is not valid Unicode' }]);
      return invalid(`the body is not valid JSON: ${e.message}`, [{ field: 'body', issue: 'not valid JSON' }]);
    case 'entity.too.large':
      return new BoxhostError('payload_too_large', `the body is larger than the limit of ${e.limit} bytes`);
    case 'charset.unsupported':
      return new StatusError(415, 'invalid_argument', `the body's charset ${JSON.stringify(String(e.charset ?? ''))} is not supported: JSON bodies are UTF-8`, [
        { field: 'content-type', issue: 'charset must be utf-8' },
      ]);
    case 'encoding.unsupported':
      return new StatusError(415, 'invalid_argument', `Content-Encoding ${JSON.stringify(String(e.encoding ?? ''))} is not supported (${CONTENT_CODINGS})`, [
        { field: 'content-encoding', issue: `must be one of ${CONTENT_CODINGS}` },
      ]);
    default:
      break;
  }
  // A decompression stream that choked on the bytes (zlib codes `Z_DATA_ERROR`, `Z_BUF_ERROR`…).
  if (typeof e.code === 'string' && /^Z_/.test(e.code)) {
    return invalid('the body does not decode as its Content-Encoding says', [{ field: 'content-encoding', issue: 'the body is not encoded this way' }]);
  }
  if (e.type === 'request.aborted') return invalid('the request was aborted before its body arrived');
  if (status === 413) return new BoxhostError('payload_too_large', 'the body is too large');
  // Any other client error of the HTTP layer: its message is meant for the client (`expose`).
  return invalid(e.expose && typeof e.message === 'string' ? e.message : 'the request is malformed');
}

/** Maps anything thrown on the way to a reply onto the error contract; never leaks a stack. */
export const errorHandler: ErrorRequestHandler = (err, req, res, _next) => {
  let error: BoxhostError;
  const e = err as any;
  const fromHttp = err instanceof BoxhostError ? undefined : clientError(e);
  // (A BoxhostError some library stripped of its code falls through to `internal`.)
  if (err instanceof BoxhostError && err.code !== 'internal' && statusOf(err.code)) error = err;
  else if (fromHttp) error = fromHttp;
  else if (err instanceof ValidationError) error = invalid(err.message);
  else if (err instanceof QueueUnavailableError || e?.code === 'ECONNREFUSED' || isBusy(err)) {
    // Which service, in plain words; its own text (socket paths, addresses) stays in the log.
    const which = err instanceof QueueUnavailableError ? 'the job queue' : isBusy(err) ? 'the database' : 'a service the api depends on';
    req.log?.warn({ err }, 'backing service unavailable');
    error = new BoxhostError('unavailable', `${which} is unavailable; try again shortly (request id ${(req as any).id})`);
  } else {
    const id = (req as any).id;
    req.log?.error({ err }, 'unexpected error');
    error = new BoxhostError('internal', `internal error (request id ${id})`);
  }
  const status = httpStatusOf(error);
  if (status >= 500) req.log?.warn({ code: error.code, msg: error.message }, 'request failed');
  if (res.headersSent) return res.end();
  for (const [k, v] of Object.entries(error.headers ?? {})) res.setHeader(k, v);
  res.status(status).json(error.toBody());
};

