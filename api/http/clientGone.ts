import type { Response } from 'express';

/**
 * Runs `fn` with a signal that aborts when the client goes away before its answer was sent:
 * what it started (an exec, a verb) ends with it instead of holding a slot until its timeout.
 */
export async function untilClientGone<T>(res: Response, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const gone = new AbortController();
  const onClose = () => {
    if (!res.writableFinished) gone.abort();
  };
  res.on('close', onClose);
  try {
    return await fn(gone.signal);
  } finally {
    res.off('close', onClose);
  }
}
