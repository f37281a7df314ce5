import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Response } from 'express';

/**
 * A log answered as it comes (service logs, base build logs): 200 text/plain with its headers
 * sent at once, so a follow shows up before the first line; a client that goes away ends the
 * read (and a follow in the box or the db); a failure mid-way can only cut the body.
 */
export async function streamText(res: Response, data: Readable): Promise<void> {
  res.status(200);
  res.setHeader('content-type', 'text/plain; charset=utf-8');
  res.setHeader('x-content-type-options', 'nosniff');
  res.setHeader('cache-control', 'no-store');
  res.flushHeaders();
  res.on('close', () => data.destroy());
  await pipeline(data, res).catch(() => res.destroy());
}
