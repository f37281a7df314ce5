import type { Registry } from 'prom-client';
import type { DomainContext } from '../domain/context';

export type { Identity } from '../domain/context';

/** What route handlers get: the domain's context plus the api's own metrics. */
export interface ApiContext extends DomainContext {
  metrics: Registry;
}
