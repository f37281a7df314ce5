/** A unique-constraint violation, as sqlite and Postgres each report it. */
export const isUniqueViolation = (e: unknown): boolean => {
  const err = e as { code?: string; message?: string } | undefined;
  return err?.code === 'SQLITE_CONSTRAINT' || err?.code === 'SQLITE_CONSTRAINT_UNIQUE' || err?.code === 'SQLITE_CONSTRAINT_PRIMARYKEY' || err?.code === '23505' || /UNIQUE constraint/.test(err?.message ?? '');
};
