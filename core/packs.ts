import crypto from 'node:crypto';
import type { PackManifest, PackRevisionSpec } from './apiTypes';

/** JSON with object keys sorted at every depth: one text per content, whatever the key order. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o).filter((k) => o[k] !== undefined).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

/** A content hash as packs show it: the first 12 hex digits of the sha256 of the canonical JSON. */
export const contentHash = (v: unknown): string => crypto.createHash('sha256').update(canonicalJson(v)).digest('hex').slice(0, 12);

/** A revision's hash: what an instance pins (`pack_rev`). */
export const revisionHash = (r: PackRevisionSpec): string => contentHash(r);

/** The manifest's hash: the pack's `rev` (installing the same content again changes nothing). */
export const manifestHash = (m: PackManifest): string => contentHash({ ...m, description: m.description ?? null });

/** `VERB_ENV` names a verb may declare: what a shell takes as a variable name. */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
