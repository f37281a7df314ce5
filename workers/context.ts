import type { Config } from '../core/config';
import type { Logger } from '../core/logger';
import type { Db } from '../db/knex';
import type { NetworkDriver, RuntimeDriver, StorageDriver, VolumeDriver } from './drivers';
import type { BoxSteps } from './boxSteps';
import type { RecipeBases } from './bases/recipeBases';
import type { SourcesProxy } from './bases/sourcesProxy';

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
  /** The bases this node makes from a recipe on first use (`debian`). */
  recipes?: RecipeBases;
  /** What a build box reaches its package sources through while its script runs (BOXHOST_BUILD_SOURCES). */
  sourcesProxy?: SourcesProxy;
  /** BullMQ's state of an operation's job (`waiting`, `active`, `failed` …) or `missing`. */
  jobState(operationId: string): Promise<string>;
}
