import { conflict, invalid } from '../../core/errors';
import type { BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, NodeClient } from '../../cluster/types';
import { settleWithin } from '../../core/timeout';
import type { RuntimeDriver, StorageDriver } from '../drivers';
import { BoxNotRunningError, ExecInputError } from '../errors';

const HEALTH_TIMEOUT_MS = 2000;

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

  async exec(boxId: string, req: ExecRequest): Promise<ExecResult> {
    try {
      return await this.runtime.exec(boxId, req);
    } catch (e) {
      if (e instanceof ExecInputError) {
        const field = e.field === 'timeout' ? 'timeout_secs' : e.field;
        throw invalid(e.message, [{ field, issue: e.message }]);
      }
      if (e instanceof BoxNotRunningError) throw conflict('the box is not running');
      throw e;
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

  private healthCheck?: Promise<string>;
  private healthStarted = 0;

  /**
   * "ok", or why the storage failed (or did not answer in time). One check at a time: while a
   * hung pool keeps a check waiting, later calls answer at once instead of piling up
   * commands.
   */
  async storageHealth(): Promise<string> {
    if (this.healthCheck) return `error: no answer (a check has been waiting for ${Math.round((Date.now() - this.healthStarted) / 1000)} s)`;
    this.healthStarted = Date.now();
    const check = this.storage.health().then(
      () => 'ok',
      (e: Error) => `error: ${e.message}`,
    );
    this.healthCheck = check.finally(() => (this.healthCheck = undefined));
    return settleWithin(check, HEALTH_TIMEOUT_MS, `error: no answer within ${HEALTH_TIMEOUT_MS / 1000} s`);
  }

}
