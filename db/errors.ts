/** sqlite's "locked by another connection", in any of its extended codes (SQLITE_BUSY_SNAPSHOT…). */
export const isBusy = (e: unknown): boolean => /^SQLITE_BUSY/.test(String((e as { code?: unknown } | undefined)?.code ?? ''));

/** A unique-constraint violation, as sqlite and Postgres each report it. */
export const isUniqueViolation = (e: unknown): boolean => {
  const err = e as { code?: string; message?: string } | undefined;
  return err?.code === 'SQLITE_CONSTRAINT' || err?.code === 'SQLITE_CONSTRAINT_UNIQUE' || err?.code === 'SQLITE_CONSTRAINT_PRIMARYKEY' || err?.code === '23505' || /UNIQUE constraint/.test(err?.message ?? '');
};
