import { BoxhostError, conflict, invalid } from '../../core/errors';
import type { BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, NodeClient } from '../../cluster/types';
import { settleWithin } from '../../core/timeout';
import type { RuntimeDriver, StorageDriver } from '../drivers';
import { BoxAgentUnavailableError, BoxNotRunningError, ExecInputError } from '../errors';

const HEALTH_TIMEOUT_MS = 2000;
/** A storage check unanswered this long makes the node report its storage failing. */
const STALL_MS = 15_000;
/** How long a caller over the node's exec cap is told to wait: a slot frees whenever one ends. */
const EXEC_RETRY_AFTER_S = 1;
/** How long a caller is told to wait while the node's storage is being restarted. */
const STORAGE_RETRY_AFTER_S = 5;

/**
 * This node's side of `NodeClient`, straight on its drivers: what the api calls in-process
 * when the node shares its process, and what the node agent serves over HTTP otherwise.
 * Driver errors become the contract's errors here, so both transports answer alike.
 */
export class LocalNode implements NodeClient {
  constructor(
    readonly nodeId: string,
    private readonly runtime: RuntimeDriver,
    private readonly storage: StorageDriver,
  ) {}

  /**
   * Execs this node runs at most at once, whoever asks (`config.execLimits.perNode`, set by the
   * composition root): the api counts per box and per token, but only the node sees every api
   * process's execs together. Over it → 429 `rate_limited`.
   */
  maxConcurrentExecs = Infinity;
  private runningExecs = 0;

  /** Execs running on this node now. */
  get execsRunning(): number {
    return this.runningExecs;
  }

  async exec(boxId: string, req: ExecRequest): Promise<ExecResult> {
    if (this.runningExecs >= this.maxConcurrentExecs) {
      throw new BoxhostError('rate_limited', `node ${this.nodeId} is running its most concurrent execs (${this.maxConcurrentExecs}); try again when one has ended`, [], {
        'Retry-After': String(EXEC_RETRY_AFTER_S),
      });
    }
    // While the storage watchdog restarts the storage, every box's root is gone or coming back.
    if (this.storageRecovering) {
      throw new BoxhostError('unavailable', `the storage of node ${this.nodeId} is being restarted and its boxes started again; try again in a few seconds`, [], {
        'Retry-After': String(STORAGE_RETRY_AFTER_S),
      });
    }
    // A caller that left before its exec started: nothing to run for it.
    if (req.signal?.aborted) throw new BoxhostError('unavailable', 'the exec was cancelled before it started: its caller went away');
    this.runningExecs++;
    try {
      // The signal goes to the runtime, which ends the process when the caller goes away.
      return await this.runtime.exec(boxId, req);
    } catch (e) {
      if (e instanceof ExecInputError) {
        const field = e.field === 'timeout' ? 'timeout_secs' : e.field;
        throw invalid(e.message, [{ field, issue: e.message }]);
      }
      if (e instanceof BoxNotRunningError) throw conflict('the box is not running');
      if (e instanceof BoxAgentUnavailableError) {
        throw new BoxhostError('unavailable', `the box's agent (boxd) is not answering: ${e.message}; the box may need a restart`, [], { 'Retry-After': '5' });
      }
      throw e;
    } finally {
      this.runningExecs--;
    }
  }

  async updateLimits(boxId: string, limits: BoxLimits): Promise<void> {
    // A box that is not running gets its limits at its next start (they are in its row).
    if ((await this.runtime.status(boxId)) !== 'running') return;
    await this.runtime.update(boxId, limits);
  }

  listSnapshots(boxId: string): Promise<BoxSnapshotInfo[]> {
    return this.storage.listBoxSnapshots(boxId);
  }

  /** Set by the storage watchdog while it brings the storage back (why it had to). */
  storageRecovering: string | null = null;

  private healthCheck?: Promise<string>;
  private healthStarted = 0;

  /** What the last check that ended said ('ok' until one has). */
  private lastHealth = 'ok';

  /**
   * "ok", or why the storage failed (or has not answered for STALL_MS). One check at a time:
   * while a slow or hung pool keeps a check waiting, later calls answer at once instead of piling
   * up commands. A check that is merely slow (a busy zfs-fuse can take seconds to answer
   * `zpool list`) answers what the last one said: a node must not refuse boxes because one look
   * was slow; a storage that stays silent is reported after STALL_MS, and restarted by the
   * storage watchdog.
   */
  async storageHealth(): Promise<string> {
    if (this.storageRecovering) return `error: recovering: ${this.storageRecovering}`;
    const waited = Date.now() - this.healthStarted;
    if (this.healthCheck) return waited >= STALL_MS ? `error: no answer (a check has been waiting for ${Math.round(waited / 1000)} s)` : this.lastHealth;
    this.healthStarted = Date.now();
    const check = this.storage.health().then(
      () => 'ok',
      (e: Error) => `error: ${e.message}`,
    );
    this.healthCheck = check.then((h) => (this.lastHealth = h)).finally(() => (this.healthCheck = undefined));
    return settleWithin(check, HEALTH_TIMEOUT_MS, this.lastHealth);
  }

}
