import crypto from 'node:crypto';
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

/**
 * A token's key in the counters: an HMAC of its secret under the admin token's hash, which every
 * api process has and Redis never sees. Not the plain hash the db keeps for the token, so key
 * names in Redis say nothing that helps guess a token offline.
 */
function limitKey(api: ApiContext, secret: string): string {
  return crypto.createHmac('sha256', api.adminTokenHash).update(secret).digest('base64url').slice(0, 32);
}

/**
 * Counts one request of its caller and answers who the caller is: a request with a bearer token
 * counts against that token (by `limitKey`, so the count is taken while the token is looked up
 * rather than after), and one whose token is not valid, or that has none, against its client
 * address as well (so guessing tokens is limited too). Over a limit: the 429 is thrown.
 */
export async function admitCaller(api: ApiContext, req: { headers: { authorization?: string }; socket: { remoteAddress?: string } }): Promise<Identity | undefined> {
  const secret = bearer(req);
  const byAddress = () => api.limits.requests.consume(`addr:${req.socket.remoteAddress ?? 'unknown'}`);
  if (!secret) return void (await byAddress());
  const [identity] = await Promise.all([authenticate(api.db, api.adminTokenHash, secret), api.limits.requests.consume(`token:${limitKey(api, secret)}`)]);
  if (identity) return identity;
  await byAddress();
  return undefined;
}

/**
 * Before any route: one request counted against its token, and against its client address when
 * it carries no valid token (so guessing tokens is limited too). The identity found is kept in
 * `res.locals` for the route, which then does not look the token up again.
 */
export function rateLimitRequests(api: ApiContext, routes: RouteDef[]): RequestHandler {
  const open = publicPaths(routes);
  return async (req, res, next) => {
    if (open.has(req.path)) return next();
    try {
      const identity = await admitCaller(api, req);
      if (identity) res.locals.identity = identity;
      next();
    } catch (e) {
      next(e);
    }
  };
}
