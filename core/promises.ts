/** Promise.all that waits for every promise to settle before it throws the first failure (in
 *  the order given, not the order they failed): nothing is left running behind a failure. */
export async function allSettledOrThrow<T extends readonly unknown[]>(ps: { [K in keyof T]: Promise<T[K]> }): Promise<T> {
  const rs = await Promise.allSettled(ps);
  const failed = rs.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
  return rs.map((r) => (r as PromiseFulfilledResult<unknown>).value) as unknown as T;
}
