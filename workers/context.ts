import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { NetworkDriver, RuntimeDriver, StorageDriver } from './drivers';

/** What job handlers get: the db and the host drivers, nothing else. */
export interface WorkerContext {
  config: Config;
  db: Db;
  log: Logger;
  storage: StorageDriver;
  runtime: RuntimeDriver;
  network: NetworkDriver;
  /** BullMQ's state of an operation's job (`waiting`, `active`, `failed` …) or `missing`. */
  jobState(operationId: string): Promise<string>;
}
