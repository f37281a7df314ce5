import type { Logger } from '../core/logger';
import { sleep } from '../core/command';
import type { StorageDriver, StorageProbe } from './drivers';

export interface StorageWatchdogOptions {
  storage: StorageDriver;
  log: Logger;
  /** How often the storage is looked at while it answers. */
  intervalMs: number;
  /** How long it may give no answer before it counts as hung. */
  hangMs: number;
  /** Brings the storage (and what lost it) back; `why` says what was seen. Throws when it could not. */
  recover(why: string): Promise<void>;
}

export interface StorageWatchdog {
  /** What the last look saw. */
  readonly last: StorageProbe | null;
  /** Times `recover` ran to the end. */
  readonly recoveries: number;
  stop(): Promise<void>;
}

/** A look never waits longer than this (a hung storage is seen as several missed looks). */
const PROBE_TIMEOUT_MS = 10_000;
/** After a recovery that failed, the next attempt waits this long (doubling up to 5 min). */
const RETRY_MS = 5_000;

/**
 * Notices a storage that died (its daemon gone, its pool or mounts lost) or hung (no answer to
 * `zpool list` or a statfs of the pool root for `hangMs`), and has the node recover it. zfs-fuse
 * is old software that has deadlocked here under concurrent deletes (issue 13); kernel ZFS can
 * wedge too, but boxhost cannot restart a kernel module: there the watchdog only reports.
 *
 * One look at a time; a look that finds trouble is repeated soon (within a second, not after
 * `intervalMs`), so a dead daemon is restarted within a few seconds and a hung one about
 * `hangMs` after its trouble began.
 */
export function startStorageWatchdog(opts: StorageWatchdogOptions): StorageWatchdog {
  const log = opts.log.child({ part: 'storage-watchdog' });
  let stopped = false;
  let wake: (() => void) | undefined;
  const state = { last: null as StorageProbe | null, recoveries: 0 };
  // Unref'd (a watchdog keeps no process alive), so a nap must never begin once stopped: the
  // stop would wait on a timer nothing else keeps the event loop alive for.
  const nap = (ms: number) =>
    new Promise<void>((resolve) => {
      if (stopped) return resolve();
      const timer = setTimeout(resolve, ms);
      timer.unref();
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });

  const loop = async () => {
    let troubleSince = 0;
    let retryMs = RETRY_MS;
    let reported = '';
    while (!stopped) {
      const lookedAt = Date.now();
      const probe = await opts.storage.probe(Math.min(PROBE_TIMEOUT_MS, opts.hangMs));
      if (stopped) break;
      state.last = probe;
      if (probe.state === 'ok' || probe.state === 'error') {
        if (troubleSince) log.info({ probe }, 'storage answers again');
        troubleSince = 0;
        retryMs = RETRY_MS;
        if (probe.state === 'error' && probe.detail !== reported) log.warn({ probe }, 'storage answers but is not usable; a restart would not mend it');
        reported = probe.state === 'error' ? probe.detail : '';
        await nap(opts.intervalMs);
        continue;
      }
      // Trouble since the look that first found it began (a hung look took its whole timeout).
      troubleSince ||= lookedAt;
      // Dead: seen twice (a look racing a daemon another process is starting is not enough).
      // Hung: no answer for hangMs.
      // A daemon that still answers `zpool list` while a statfs of its root waits is given twice
      // as long: under 20 concurrent destroys of hundreds of roots zfs-fuse's data path has
      // stalled for over 30 s and come back by itself (seen at 600 boxes), and a restart costs
      // every box a restart; a daemon that answers nothing is hung for sure.
      const hangMs = probe.scope === 'only-mounts' ? 2 * opts.hangMs : opts.hangMs;
      const due = probe.state === 'dead' ? await confirm(opts.storage) : Date.now() - troubleSince >= hangMs;
      if (stopped) break;
      if (!due) {
        // Looked at again soon, not in a tight loop (a look that fails fast must not spin).
        await nap(Math.min(opts.intervalMs, 1000));
        continue;
      }
      const why = probe.state === 'dead' ? `storage died (${probe.detail})` : `storage hung (${probe.detail}; no answer for ${Math.round((Date.now() - troubleSince) / 1000)} s)`;
      if (!opts.storage.restartable) {
        if (reported !== why) log.error({ probe }, `${why}; this storage cannot be restarted by boxhost: restart ZFS on the host`);
        reported = why;
        await nap(opts.intervalMs);
        continue;
      }
      log.error({ probe }, `${why}: restarting it`);
      const t0 = Date.now();
      try {
        await opts.recover(why);
        state.recoveries++;
        log.warn({ ms: Date.now() - t0, recoveries: state.recoveries }, 'storage recovered');
        troubleSince = 0;
        retryMs = RETRY_MS;
      } catch (e) {
        log.error({ err: (e as Error).message, ms: Date.now() - t0, retryInMs: retryMs }, 'storage recovery failed; trying again');
        await nap(retryMs);
        retryMs = Math.min(retryMs * 2, 300_000);
      }
    }
  };
  const running = loop().catch((e) => log.error({ err: (e as Error).message }, 'storage watchdog stopped by an error'));

  return {
    get last() {
      return state.last;
    },
    get recoveries() {
      return state.recoveries;
    },
    async stop() {
      stopped = true;
      wake?.();
      await running;
    },
  };
}

/** A second look, a moment later, that also finds the storage dead. */
async function confirm(storage: StorageDriver): Promise<boolean> {
  await sleep(200);
  return (await storage.probe(PROBE_TIMEOUT_MS)).state === 'dead';
}
