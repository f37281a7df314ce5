import type { ErrorRequestHandler, RequestHandler } from 'express';
import { ValidationError } from 'joi';
import { QueueUnavailableError } from '../../jobs/queue';
import { BoxhostError, invalid, notFound, statusOf } from '../../core/errors';

/** Maps anything thrown on the way to a reply onto the error contract; never leaks a stack. */
export const errorHandler: ErrorRequestHandler = (err, req, res, _next) => {
  let error: BoxhostError;
  const e = err as any;
  if (err instanceof BoxhostError && err.code !== 'internal') error = err;
  else if (e?.type === 'entity.parse.failed') error = invalid(`the body is not valid JSON: ${e.message}`, [{ field: 'body', issue: 'not valid JSON' }]);
  else if (e?.type === 'entity.too.large') error = new BoxhostError('payload_too_large', `the body is larger than the limit of ${e.limit} bytes`);
  else if (e?.type === 'encoding.unsupported' || e?.type === 'charset.unsupported') error = invalid(e.message);
  else if (err instanceof ValidationError) error = invalid(err.message);
  else if (err instanceof QueueUnavailableError || e?.code === 'ECONNREFUSED' || e?.code === 'SQLITE_BUSY') {
    error = new BoxhostError('unavailable', `a backing service is unavailable: ${err.message}`);
  } else {
    const id = (req as any).id;
    req.log?.error({ err }, 'unexpected error');
    error = new BoxhostError('internal', `internal error (request id ${id})`);
  }
  const status = statusOf(error.code);
  if (status >= 500) req.log?.warn({ code: error.code, msg: error.message }, 'request failed');
  for (const [k, v] of Object.entries(error.headers)) res.setHeader(k, v);
  if (res.headersSent) return res.end();
  res.status(status).json(error.toBody());
};

export const unknownRoute: RequestHandler = (req, _res, next) => next(notFound(`route ${req.method} ${req.path}`));
