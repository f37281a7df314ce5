import type { Registry } from 'prom-client';
import type { DomainContext } from '../domain/context';
import type { ExecSlots } from '../domain/exec';
import type { TicketStore } from '../domain/tickets';

export type { Identity } from '../domain/context';

/** Counts requests of one caller (`token:<key of its secret>` or `addr:<ip>`); over the limit it throws the
 *  contract's 429 `rate_limited` with `Retry-After` (api/http/rateLimit.ts). */
export interface RequestLimiter {
  consume(key: string): Promise<void>;
}

/** What the api counts in Redis so that its limits hold across api processes. */
export interface ApiLimits {
  /** Requests per token (or client address): `config.rateLimit`. */
  requests: RequestLimiter;
  /** Concurrent execs per box and per token: `config.execLimits`. */
  execSlots: ExecSlots;
  /** Single-use WebSocket tickets (domain/tickets.ts), shared by every api process. */
  tickets: TicketStore;
}

/** What route handlers get: the domain's context plus the api's own metrics and limits. */
export interface ApiContext extends DomainContext {
  metrics: Registry;
  limits: ApiLimits;
}
