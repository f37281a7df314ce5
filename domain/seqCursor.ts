import { invalidField } from '../core/errors';

/**
 * The continuation token of a list paged back from the newest row by its position (`seq`):
 * events and operations. The token is the last position returned, so rows added meanwhile
 * never shift a page.
 */
export const encodeSeqCursor = (seq: number) => Buffer.from(JSON.stringify({ before: seq })).toString('base64url');

export function decodeSeqCursor(token: string): number {
  try {
    const v = JSON.parse(Buffer.from(token, 'base64url').toString()) as { before?: unknown };
    if (Number.isInteger(v.before)) return v.before as number;
  } catch {
    // fall through
  }
  throw invalidField('continuation_token', 'is not a token this api gave out');
}
