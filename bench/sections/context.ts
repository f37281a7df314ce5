/** What each section of the bench gets: the host and its clients, the knobs, the profiler and
 *  the collectors it adds its figures, notes and results to. */
import type { Config } from '../../core/config';
import type { Host } from '../../server/host';
import type { RuncRuntime } from '../../workers/runtime/runc';
import type { ZfsStorage } from '../../workers/storage/zfs';
import type { Api } from '../api';
import type { Knobs } from '../knobs';
import type { Profiler } from '../profile';
import type { Figure } from '../report';
import type { Resources } from '../teardown';

export interface SectionContext {
  api: Api;
  host: Host;
  config: Config;
  storage: ZfsStorage;
  runtime: RuncRuntime;
  knobs: Knobs;
  profiler: Profiler;
  /** The host's log entries so far (for the per-operation breakdown). */
  logs: any[];
  figures: Figure[];
  notes: string[];
  /** results.json, in the order the sections fill it. */
  results: Record<string, any>;
  /** What the teardown removes; a section adds what it makes. */
  resources: Resources;
  progress: (msg: string) => void;
  /** Throws once the bench was interrupted. */
  checkpoint: () => void;
}
