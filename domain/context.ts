import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { OperationQueue } from '../jobs/queue';
import type { NodeDirectory } from './nodes';

/** What the domain services work with: the db, the queues, and the nodes (through their
 *  `NodeClient`s). No host driver: the api process may run anywhere, unprivileged. */
export interface DomainContext {
  config: Config;
  db: Db;
  log: Logger;
  queue: OperationQueue;
  nodes: NodeDirectory;
  /** sha256 of the bootstrap admin token. */
  adminTokenHash: string;
}

/** Who is calling: the token's name is the `who` of events. */
export interface Identity {
  tokenId: string;
  name: string;
  /** null: every project (and the admin routes). */
  projects: string[] | null;
  /** Token scopes (`deploy`: deploy and roll back instances of its projects). */
  scopes?: string[];
}
