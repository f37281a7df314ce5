import type { ErrorRequestHandler, RequestHandler } from 'express';
import { ValidationError } from 'joi';
import { QueueUnavailableError } from '../../jobs/queue';
import { ApiError, invalid, notFound } from './errors';

/** Maps anything thrown on the way to a reply onto the error contract; never leaks a stack. */
export const errorHandler: ErrorRequestHandler = (err, req, res, _next) => {
  let apiError: ApiError;
  const e = err as any;
  if (err instanceof ApiError) apiError = err;
  else if (e?.type === 'entity.parse.failed') apiError = invalid(`the body is not valid JSON: ${e.message}`, [{ field: 'body', issue: 'not valid JSON' }]);
  else if (e?.type === 'entity.too.large') apiError = new ApiError(413, 'payload_too_large', `the body is larger than the limit of ${e.limit} bytes`);
  else if (e?.type === 'encoding.unsupported' || e?.type === 'charset.unsupported') apiError = invalid(e.message);
  else if (err instanceof ValidationError) apiError = invalid(err.message);
  else if (err instanceof QueueUnavailableError || e?.code === 'ECONNREFUSED' || e?.code === 'SQLITE_BUSY') {
    apiError = new ApiError(503, 'unavailable', `a backing service is unavailable: ${err.message}`);
  } else {
    const id = (req as any).id;
    req.log?.error({ err }, 'unexpected error');
    apiError = new ApiError(500, 'internal', `internal error (request id ${id})`);
  }
  if (apiError.status >= 500) req.log?.warn({ code: apiError.code, msg: apiError.message }, 'request failed');
  for (const [k, v] of Object.entries(apiError.headers)) res.setHeader(k, v);
  if (res.headersSent) return res.end();
  res.status(apiError.status).json(apiError.toBody());
};

export const unknownRoute: RequestHandler = (req, _res, next) => next(notFound(`route ${req.method} ${req.path}`));
