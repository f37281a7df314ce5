import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { NetworkDriver, RuntimeDriver, StorageDriver, VolumeDriver } from './drivers';
import type { BoxSteps } from './boxSteps';

/** What the node side works with: the db, the host drivers, and the box steps made of them. */
export interface WorkerContext {
  config: Config;
  db: Db;
  log: Logger;
  storage: StorageDriver;
  runtime: RuntimeDriver;
  network: NetworkDriver;
  volumes: VolumeDriver;
  boxes: BoxSteps;
  /** BullMQ's state of an operation's job (`waiting`, `active`, `failed` …) or `missing`. */
  jobState(operationId: string): Promise<string>;
}
