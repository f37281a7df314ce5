/**
 * `p`, or `fallback` once `ms` have passed (whichever comes first). The work behind `p` is not
 * stopped; callers that must not pile it up keep one in flight (see LocalNode.storageHealth).
 */
export function settleWithin<T>(p: Promise<T>, ms: number, fallback: T): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<T>((resolve) => (timer = setTimeout(() => resolve(fallback), ms)))]).finally(() => clearTimeout(timer));
}
