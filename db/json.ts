/** JSON columns are text in both sqlite and Postgres; these keep the encoding in one place. */
export const toJson = (v: unknown): string | null => (v === undefined || v === null ? null : JSON.stringify(v));
export function fromJson<T>(v: string | null | undefined): T | null {
  return v === null || v === undefined ? null : (JSON.parse(v) as T);
}
