import type { Knex } from 'knex';
import type { Db } from './knex';

/** JSON columns are text in both sqlite and Postgres; these keep the encoding in one place. */
export const toJson = (v: unknown): string | null => (v === undefined || v === null ? null : JSON.stringify(v));
export function fromJson<T>(v: string | null | undefined): T | null {
  return v === null || v === undefined ? null : (JSON.parse(v) as T);
}

/**
 * What the boxes' `config` columns hold, summed by the database (sqlite's `json_extract`,
 * Postgres' `->>`) instead of every row carried to the process and parsed there: admission reads
 * it for every create (per node, and per project for the quotas): at 1000 boxes on sqlite, 3.68 ms
 * per read with the rows, 1.19 ms with the sums (this VM, a slow day). Each select names `boxes`,
 * `cpus`, `ram_mb` and `storage_gb`.
 */
export function boxConfigSums(db: Db): Knex.Raw[] {
  const num = (key: 'cpus' | 'ram_mb' | 'storage_gb') => (db.client.config.client === 'pg' ? `(config::json->>'${key}')::numeric` : `json_extract(config, '$.${key}')`);
  return [db.raw('count(*) as boxes'), ...(['cpus', 'ram_mb', 'storage_gb'] as const).map((k) => db.raw(`coalesce(sum(${num(k)}), 0) as ${k}`))];
}

/** A row of `boxConfigSums` as numbers (Postgres answers sums and counts as strings). */
export const configSumsOf = (r: { boxes: number | string; cpus: number | string; ram_mb: number | string; storage_gb: number | string } | undefined) => ({
  boxes: Number(r?.boxes ?? 0),
  cpus: Number(r?.cpus ?? 0),
  ram_mb: Number(r?.ram_mb ?? 0),
  storage_gb: Number(r?.storage_gb ?? 0),
});

/** Saved and imported bases take their size from a project's storage quota and from their
 *  node's storage (docs/bases.md "Space"): their bytes, in whole GB rounded up. */
export const basesGb = (bytes: number | string | null | undefined) => Math.ceil(Number(bytes ?? 0) / 1024 ** 3);
