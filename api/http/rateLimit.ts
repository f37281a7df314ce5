import type { RequestHandler } from 'express';
import type IORedis from 'ioredis';
import { BurstyRateLimiter, RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { BoxhostError } from '../../core/errors';
import type { Config } from '../../core/config';
import { authenticate } from '../../domain/tokens';
import type { ApiContext, RequestLimiter } from '../context';
import type { Identity } from '../../domain/context';
import type { RouteDef } from './route';
import { bearer } from './route';

/** 429 `rate_limited` with `Retry-After` in whole seconds (at least 1). */
export const rateLimited = (message: string, retryAfterMs: number) =>
  new BoxhostError('rate_limited', message, [], { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) });

/**
 * `rps` requests per second and, over that, up to `burst` more per refill window of
 * ⌈burst / rps⌉ s (rate-limiter-flexible's BurstyRateLimiter: a base limiter, then a burst pool
 * that refills at the sustained rate). Both counters live in Redis under the cluster's prefix,
 * so every api process counts against the same numbers; while Redis does not answer, each
 * process counts in memory (the `insuranceLimiter`) rather than refusing or waving everyone
 * through. docs/decisions.md "Access".
 */
export function createRequestLimiter(redis: IORedis, prefix: string, limit: Config['rateLimit']): RequestLimiter {
  // rps may be fractional (0.1): the base window stretches to hold one whole request.
  const baseWindow = limit.rps >= 1 ? 1 : Math.round(1 / limit.rps);
  const basePoints = Math.max(1, Math.round(limit.rps * baseWindow));
  const burstWindow = Math.max(1, Math.ceil(limit.burst / limit.rps));
  const store = (keyPrefix: string, points: number, duration: number) =>
    new RateLimiterRedis({
      storeClient: redis,
      keyPrefix: `${prefix}:ratelimit:${keyPrefix}`,
      points,
      duration,
      rejectIfRedisNotReady: true,
      insuranceLimiter: new RateLimiterMemory({ keyPrefix, points, duration }),
    });
  const limiter = new BurstyRateLimiter(store('base', basePoints, baseWindow), store('burst', limit.burst, burstWindow));
  return {
    async consume(key) {
      try {
        await limiter.consume(key, 1);
      } catch (e) {
        if (e instanceof RateLimiterRes) {
          throw rateLimited(`too many requests: at most ${limit.rps}/s with bursts of ${limit.burst} per caller`, e.msBeforeNext);
        }
        throw e;
      }
    },
  };
}

/** Paths of the public routes (`/healthz`, `/version`, `/metrics`, `/openapi.json`): never
 *  limited, so health checks and scrapers work whatever a caller does. */
const publicPaths = (routes: RouteDef[]) => new Set(routes.filter((r) => r.access === 'public').map((r) => r.path));

/** The caller's key: its token when the request carries a valid one, else its address. */
export async function callerKey(api: ApiContext, req: { headers: { authorization?: string }; socket: { remoteAddress?: string } }): Promise<{ key: string; identity?: Identity }> {
  const secret = bearer(req);
  const identity = secret ? await authenticate(api.db, api.adminTokenHash, secret) : null;
  if (identity) return { key: `token:${identity.tokenId}`, identity };
  return { key: `addr:${req.socket.remoteAddress ?? 'unknown'}` };
}

/**
 * Before any route: one request counted against its token, or against its client address when
 * it carries no valid token (so guessing tokens is limited too). The identity found is kept in
 * `res.locals` for the route, which then does not look the token up again.
 */
export function rateLimitRequests(api: ApiContext, routes: RouteDef[]): RequestHandler {
  const open = publicPaths(routes);
  return async (req, res, next) => {
    if (open.has(req.path)) return next();
    try {
      const { key, identity } = await callerKey(api, req);
      if (identity) res.locals.identity = identity;
      await api.limits.requests.consume(key);
      next();
    } catch (e) {
      next(e);
    }
  };
}
