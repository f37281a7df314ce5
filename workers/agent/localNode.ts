import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Duplex, Readable } from 'node:stream';
import { BoxhostError, conflict, invalid, notFound } from '../../core/errors';
import type { FileList, FileStat } from '../../core/apiTypes';
import type { BaseRef } from '../../core/box';
import { BaseTarError, stageTar } from '../bases/tarImport';
import { packBase } from '../bases/tarExport';
import { MAX_BASE_ENTRIES, stagedFile } from '../baseSteps';
import { StorageInUseError } from '../storage/zfs';
import type { VolumeInfoWire, StagedImport, BoxLimits, BoxSnapshotInfo, ExecRequest, ExecResult, ExecSession, ExecSessionRequest, NodeClient, NodeServiceSpec, NodeServiceState, ServiceGate } from '../../cluster/types';
import { settleWithin } from '../../core/timeout';
import { EXEC_LET_GO, type BoxFileInfo, type BoxFiles, type BoxServices, type ExecProcess, type RuntimeDriver, type StorageDriver, type VolumeDriver } from '../drivers';
import { startService } from './localServices';
import { BoxAgentUnavailableError, BoxFileError, BoxNeedsRestartError, BoxNotRunningError, BoxServiceError, ExecInputError } from '../errors';

const HEALTH_TIMEOUT_MS = 2000;
/** A box port that takes no connection this long is not listening. */
const TUNNEL_CONNECT_MS = 5000;
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
    private readonly volumes?: VolumeDriver,
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
    this.checkExecCap();
    this.checkStorage();
    // A caller that left before its exec started: nothing to run for it.
    if (req.signal?.aborted) throw new BoxhostError('unavailable', 'the exec was cancelled before it started: its caller went away');
    this.runningExecs++;
    try {
      // The signal goes to the runtime, which ends the process when the caller goes away.
      return await this.runtime.exec(boxId, req);
    } catch (e) {
      throw contractError(e);
    } finally {
      this.runningExecs--;
    }
  }

  /**
   * An interactive process (WebSocket exec, console), counted against the node's exec cap while
   * it runs. Resolves once boxd has started it: a cwd it cannot enter, an unknown user or a box
   * that is not running is the contract's error here, before the caller upgrades its socket.
   */
  async execSession(boxId: string, req: ExecSessionRequest): Promise<ExecSession> {
    this.checkExecCap();
    this.checkStorage();
    const abort = new AbortController();
    let proc: ExecProcess;
    // Counted from before the start: sessions starting at once cannot all pass the cap.
    this.runningExecs++;
    try {
      proc = await this.runtime.execStream(boxId, { command: req.command, cwd: req.cwd, env: req.env, user: req.user, tty: req.tty, stdin: true, signal: abort.signal, noHup: req.noHup, timeoutMs: req.timeoutMs });
    } catch (e) {
      this.runningExecs--;
      throw contractError(e);
    }
    const exited = proc.exited.then(
      (r) => ({ exitCode: r.exitCode, ...(r.timedOut ? { timedOut: true } : {}) }),
      (e) => Promise.reject(contractError(e)),
    );
    exited.finally(() => this.runningExecs--).catch(() => undefined);
    // Started, or refused: a refusal rejects `exited` with nothing run.
    if ((await proc.pid()) === 0) await exited;
    if (req.tty && req.cols && req.rows) await proc.resize(req.cols, req.rows).catch(() => undefined);
    return {
      stdin: proc.stdin!,
      stdout: proc.stdout,
      stderr: proc.stderr,
      resize: (cols, rows) => void proc.resize(cols, rows).catch(() => undefined),
      signal: (sig) => proc.signal(sig),
      close: () => abort.abort(),
      // The runtime lets go only of a process started with noHup; any other is ended.
      release: () => abort.abort(EXEC_LET_GO),
      exited,
    };
  }

  // ------------------------------------------------------------------ files (docs/files.md)

  /** A part of the box its agent serves (files, services), or the contract's error (409
   *  stopped, 503 storage or agent down). */
  private async agentPart<T>(get: () => Promise<T>): Promise<T> {
    this.checkStorage();
    return get().catch(rethrow);
  }

  private files(boxId: string): Promise<BoxFiles> {
    return this.agentPart(() => this.runtime.files(boxId));
  }

  async fileStat(boxId: string, p: string): Promise<FileStat> {
    const files = await this.files(boxId);
    return fileStat(p, await files.stat(p).catch(rethrow));
  }

  async fileList(boxId: string, p: string): Promise<FileList> {
    const files = await this.files(boxId);
    const { entries, truncated } = await files.list(p).catch(rethrow);
    return { entries: entries.map((e) => fileStat(path.posix.join(p, e.name), e)), truncated };
  }

  async fileRead(boxId: string, p: string): Promise<{ stat: FileStat; data: Readable }> {
    const files = await this.files(boxId);
    const { info, data } = await files.read(p).catch(rethrow);
    return { stat: fileStat(p, info), data };
  }

  async fileWrite(boxId: string, p: string, data: Readable, mode?: number): Promise<FileStat> {
    const files = await this.files(boxId);
    return fileStat(p, await files.write(p, data, { mode, parents: true }).catch(rethrow));
  }

  async fileDelete(boxId: string, p: string, recursive: boolean): Promise<void> {
    const files = await this.files(boxId);
    await files.remove(p, { recursive }).catch(rethrow);
  }

  // ------------------------------------------------ services (docs/services.md, boxd supervises)

  private services(boxId: string): Promise<BoxServices> {
    return this.agentPart(() => this.runtime.services(boxId));
  }

  async serviceStart(boxId: string, spec: NodeServiceSpec, gate?: ServiceGate): Promise<{ service: NodeServiceState; replaced: boolean }> {
    return startService(await this.services(boxId), spec, gate).catch(rethrow);
  }

  async serviceList(boxId: string): Promise<NodeServiceState[]> {
    return (await this.services(boxId)).list().catch(rethrow);
  }

  async serviceGet(boxId: string, name: string): Promise<NodeServiceState> {
    return (await this.services(boxId)).get(name).catch(rethrow);
  }

  async serviceControl(boxId: string, name: string, action: 'start' | 'stop' | 'restart', opts: { signal?: string; graceMs?: number } = {}): Promise<NodeServiceState> {
    const s = await this.services(boxId);
    const done = action === 'start' ? s.resume(name) : action === 'restart' ? s.restart(name) : s.stop(name, opts);
    return done.catch(rethrow);
  }

  async serviceDelete(boxId: string, name: string): Promise<void> {
    await (await this.services(boxId)).remove(name).catch(rethrow);
  }

  async serviceLogs(boxId: string, name: string, opts: { tail?: number; follow?: boolean }): Promise<Readable> {
    return (await this.services(boxId)).logs(name, opts).catch(rethrow);
  }

  /** A TCP connection to a box's port on this node's bridge (the publish proxy's tunnel). */
  tunnel(boxId: string, address: string, port: number): Promise<Duplex> {
    return new Promise((resolve, reject) => {
      const sock = net.connect({ host: address, port });
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new BoxhostError('unavailable', `box ${boxId} did not take a connection on port ${port} within ${TUNNEL_CONNECT_MS / 1000} s`));
      }, TUNNEL_CONNECT_MS);
      sock.once('connect', () => {
        clearTimeout(timer);
        sock.removeAllListeners('error');
        resolve(sock);
      });
      sock.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        reject(Object.assign(new BoxhostError('unavailable', `nothing answers on port ${port} of box ${boxId} (${e.code ?? e.message})`), { refused: true }));
      });
    });
  }

  /** Over the node's exec cap (execs and sessions alike) → 429 with Retry-After. */
  private checkExecCap(): void {
    if (this.runningExecs >= this.maxConcurrentExecs) {
      throw new BoxhostError('rate_limited', `node ${this.nodeId} is running its most concurrent execs (${this.maxConcurrentExecs}); try again when one has ended`, [], {
        'Retry-After': String(EXEC_RETRY_AFTER_S),
      });
    }
  }

  /** While the storage watchdog restarts the storage, every box's root is gone or coming back. */
  private checkStorage(): void {
    if (this.storageRecovering) {
      throw new BoxhostError('unavailable', `the storage of node ${this.nodeId} is being restarted and its boxes started again; try again in a few seconds`, [], {
        'Retry-After': String(STORAGE_RETRY_AFTER_S),
      });
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

  async volumeInfo(volumeId: string): Promise<VolumeInfoWire> {
    if (!this.volumes) throw new BoxhostError('unavailable', `node ${this.nodeId} holds no data volumes`);
    this.checkStorage();
    try {
      return await this.volumes.info(volumeId);
    } catch (e) {
      if (e instanceof Error && /does not exist/.test(e.message)) throw notFound(`volume ${volumeId} on node ${this.nodeId}`);
      throw contractError(e);
    }
  }

  deleteSnapshot(boxId: string, name: string): Promise<void> {
    return this.storage.destroyBoxSnapshot(boxId, name);
  }

  restoreBlockers(boxId: string, name: string): Promise<{ snapshots: string[]; forks: string[] }> {
    return this.storage.rollbackBlockers(boxId, name);
  }

  // ------------------------------------------------------------------ bases (docs/bases.md)

  /** Where uploads wait and how large they may be (set by the composition root); null: this
   *  node takes no imports. */
  baseImports: { stagingDir: string; maxBytes: number; maxUnpackedBytes: number } | null = null;

  async stageBaseImport(data: Readable): Promise<StagedImport> {
    const opts = this.baseImports;
    if (!opts) throw new BoxhostError('unavailable', `node ${this.nodeId} takes no base imports`);
    this.checkStorage();
    await fs.promises.mkdir(opts.stagingDir, { recursive: true, mode: 0o700 });
    const token = crypto.randomBytes(16).toString('hex');
    try {
      const scan = await stageTar(data, stagedFile(opts.stagingDir, token), { maxBytes: opts.maxBytes, maxUnpackedBytes: opts.maxUnpackedBytes, maxEntries: MAX_BASE_ENTRIES });
      return { token, bytes: scan.bytes, sha256: scan.sha256, entries: scan.entries, unpackedBytes: scan.unpackedBytes, dropped: scan.dropped, setidCleared: scan.setidCleared };
    } catch (e) {
      if (e instanceof BaseTarError) {
        if (e.kind === 'too_large') throw new BoxhostError('payload_too_large', e.message);
        throw invalid(`the base archive is refused: ${e.message}`, [{ field: 'body', issue: e.message }]);
      }
      throw e;
    }
  }

  async discardStagedImport(token: string): Promise<void> {
    if (!this.baseImports) return;
    await fs.promises.rm(stagedFile(this.baseImports.stagingDir, token), { force: true });
  }

  async exportBase(base: BaseRef): Promise<Readable> {
    this.checkStorage();
    if (!(await this.storage.hasBase(base))) throw notFound(`base ${base.name}@${base.version} on node ${this.nodeId}`);
    return packBase(this.storage.baseRootPath(base));
  }

  async destroyBase(base: BaseRef): Promise<void> {
    try {
      await this.storage.destroyBase(base);
    } catch (e) {
      // Box ids are not named: the boxes may be another project's.
      if (e instanceof StorageInUseError) throw conflict(`base ${base.name}@${base.version} is in use by ${e.dependents.length} box root(s) on node ${this.nodeId}`);
      throw e;
    }
  }

  /** Set by the storage watchdog while it brings the storage back (why it had to). */
  storageRecovering: string | null = null;

  private healthCheck?: Promise<string>;
  private healthStarted = 0;

  /** What the last check that ended said ('ok' until one has). */
  private lastHealth = 'ok';

  /** The watchdog restarted the storage and started its boxes on it: what checks saw of the
   *  dead or hung daemon is over, and a check of the new one that is slow to answer (under the
   *  boxes' restarts) must not answer with it. */
  storageRestored(): void {
    this.lastHealth = 'ok';
    this.healthCheck = undefined;
    this.healthStarted = 0;
  }

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

/** A driver's error as the contract's: what both transports answer. */
export function contractError(e: unknown): unknown {
  if (e instanceof ExecInputError) {
    const field = e.field === 'timeout' ? 'timeout_secs' : e.field;
    return invalid(e.message, [{ field, issue: e.message }]);
  }
  // The api asks a node only for a box its row says runs: a container that does not is being
  // restarted (the agent watchdog, a storage recovery, reconciliation), and comes back.
  if (e instanceof BoxNotRunningError) {
    return new BoxhostError('unavailable', "the box's container is not running: it is being restarted or recovered; try again shortly", [], { 'Retry-After': '5' });
  }
  if (e instanceof BoxNeedsRestartError) return conflict(e.message);
  if (e instanceof BoxAgentUnavailableError) {
    return new BoxhostError('unavailable', `the box's agent (boxd) is not answering: ${e.message}; the box may need a restart`, [], { 'Retry-After': '5' });
  }
  if (e instanceof BoxServiceError) {
    if (e.kind === 'not_found') return new BoxhostError('not_found', e.message);
    if (e.kind === 'conflict') return conflict(e.message);
    const field = e.field || 'spec';
    return invalid(e.message, [{ field, issue: e.message }]);
  }
  if (e instanceof BoxFileError) {
    switch (e.kind) {
      case 'not_found':
        // The agent's message names the path already ("open /x: no such file or directory").
        return new BoxhostError('not_found', e.message);
      case 'exists':
        return conflict(e.message);
      case 'busy':
        return conflict(`${e.message} (a mount point in use)`);
      case 'permission':
        return new BoxhostError('permission_denied', e.message);
      case 'no_space':
        return new BoxhostError('insufficient_storage', `the box is out of space: ${e.message}`);
      default:
        return invalid(e.message, [{ field: 'path', issue: e.message }]);
    }
  }
  return e;
}

const rethrow = (e: unknown): never => {
  throw contractError(e);
};

/** A path's stat in the contract's shape (DESIGN.md §6): mode as four octal digits. */
export function fileStat(p: string, info: BoxFileInfo): FileStat {
  const out: FileStat = {
    name: info.name,
    path: path.posix.normalize(p),
    type: info.type,
    size: info.size,
    mode: info.mode.toString(8).padStart(4, '0'),
    mtime: new Date(info.mtime).toISOString(),
  };
  if (info.type === 'symlink' && info.target !== undefined) out.target = info.target;
  return out;
}
