import crypto from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** Random lowercase alphanumeric string: safe in dataset, netns and container names. */
export function randomId(length = 20): string {
  const bytes = crypto.randomBytes(length);
  let out = '';
  for (const b of bytes) out += ALPHABET[b % ALPHABET.length];
  return out;
}

/** Prefixed resource ids (`op_…`, `tok_…`); box ids have no prefix since they name host objects. */
export const newId = (prefix: string) => `${prefix}_${randomId(20)}`;
export const newBoxId = () => `b${randomId(15)}`;

/** RFC 3339 UTC with milliseconds (DESIGN.md §3). */
export const now = () => new Date().toISOString();

export const sha256 = (s: string | Buffer) => crypto.createHash('sha256').update(s).digest('hex');
