import type IORedis from 'ioredis';
import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { OperationQueue } from '../jobs/queue';
import type { Registry } from 'prom-client';
import type { RuntimeDriver, StorageDriver } from '../workers/drivers';

/** What route handlers get: config, db, the queue, and the runtime for the synchronous box
 *  calls (exec) that the api makes straight against the box. */
export interface ApiContext {
  config: Config;
  db: Db;
  log: Logger;
  redis: IORedis;
  queue: OperationQueue;
  runtime: RuntimeDriver;
  /** The storage of this host's boxes: health, and reads (snapshots) that check requests. */
  storage: StorageDriver;
  metrics: Registry;
  /** sha256 of the bootstrap admin token. */
  adminTokenHash: string;
}

/** Who is calling: the token's name is the `who` of events. */
export interface Identity {
  tokenId: string;
  name: string;
  /** null: every project (and the admin routes). */
  projects: string[] | null;
}
