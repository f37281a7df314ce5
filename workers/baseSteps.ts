import fs from 'node:fs';
import { StringDecoder } from 'node:string_decoder';
import { finished } from 'node:stream/promises';
import path from 'node:path';
import type { BaseRef } from '../core/box';
import type { BoxRecord } from '../db/repos/boxes';
import type { BaseHost } from '../jobs/ports';
import type { NetworkDriver, RuntimeDriver, StorageDriver } from './drivers';
import type { SourcesProxy } from './bases/sourcesProxy';
import { extractTar, type TarLimits } from './bases/tarImport';
import type { RecipeBases } from './bases/recipeBases';

import { MAX_BASE_ENTRIES } from './bases/tarRules';
export { MAX_BASE_ENTRIES };

export interface BaseStepsDeps {
  storage: StorageDriver;
  runtime: RuntimeDriver;
  /** Where uploads wait for their import job (`<data dir>/imports`). */
  stagingDir: string;
  limits: Pick<TarLimits, 'maxUnpackedBytes'>;
  /** How long a build script may run (BOXHOST_BUILD_TIMEOUT_SECS). */
  buildTimeoutMs?: number;
  /** The bases this node makes from a recipe (`debian`). */
  recipes?: Pick<RecipeBases, 'ensure'>;
  /** While a build script runs, its box reaches the package sources through this proxy
   *  (BOXHOST_BUILD_SOURCES); absent: nothing. */
  sourcesProxy?: Pick<SourcesProxy, 'allow' | 'disallow'>;
  network?: Pick<NetworkDriver, 'openSources' | 'closeSources'>;
}

/** Test-only seam, as in boxSteps.ts: the process dies at the step BOXHOST_TEST_CRASH_AT names. */
const crashPoint = (point: string) => void (process.env.BOXHOST_TEST_CRASH_AT === point && process.kill(process.pid, 'SIGKILL'));

/** Where a node keeps uploads waiting for their import job. */
export const stagingDirOf = (config: { dataDir: string }) => path.join(config.dataDir, 'imports');

/** A staged upload's file: tokens are 32 hex, made by the node (never a caller's path). */
export function stagedFile(stagingDir: string, token: string): string {
  if (!/^[0-9a-f]{32}$/.test(token)) throw new Error('invalid staging token');
  return path.join(stagingDir, `${token}.tar`);
}

/** The node's side of base jobs (docs/bases.md), every step idempotent. */
export class BaseSteps implements BaseHost {
  constructor(private readonly d: BaseStepsDeps) {}

  async saveFromBox(box: BoxRecord, ref: BaseRef): Promise<number> {
    // A base made by an attempt that died before it dropped the hold: the hold goes now.
    if (await this.d.storage.hasBase(ref)) await this.d.storage.releaseBoxRoot(box.id, ref.version);
    else {
      try {
        // Inside the try: a pause that froze the box and then failed is thawed too.
        await this.d.runtime.pause(box.id);
        crashPoint('base-save:paused');
        await this.d.storage.holdBoxRoot(box.id, ref.version);
      } finally {
        await this.d.runtime.unpause(box.id);
      }
      await this.d.storage.baseFromBoxRoot(box.id, ref.version, ref);
    }
    return this.d.storage.baseSizeBytes(ref);
  }

  /** Everything a failed save may have left: the box frozen (a worker killed while it was
   *  held), the hold and its clone, a half-made base. Each tried even when another fails. */
  async abandonSave(boxId: string, ref: BaseRef): Promise<void> {
    const steps = [() => this.d.runtime.unpause(boxId), () => this.d.storage.releaseBoxRoot(boxId, ref.version), () => this.d.storage.destroyBase(ref)];
    const failures: unknown[] = [];
    for (const step of steps) await step().catch((e: unknown) => failures.push(e));
    if (failures.length > 0) throw failures[0];
  }

  async importStaged(token: string, ref: BaseRef): Promise<number> {
    const file = stagedFile(this.d.stagingDir, token);
    if (!(await this.d.storage.hasBase(ref))) {
      if (!fs.existsSync(file)) throw new Error(`the upload of base ${ref.name}@${ref.version} is no longer on this node`);
      crashPoint('base-import:start');
      await this.d.storage.createBase(ref, (dir) => extractTar(fs.createReadStream(file), dir, { maxUnpackedBytes: this.d.limits.maxUnpackedBytes, maxEntries: MAX_BASE_ENTRIES }).then(() => undefined));
    }
    return this.d.storage.baseSizeBytes(ref);
  }

  async makeRecipe(ref: BaseRef): Promise<boolean> {
    if (!this.d.recipes) throw new Error('this node makes no recipe bases');
    return this.d.recipes.ensure(ref);
  }

  async discardStaged(token: string): Promise<void> {
    await fs.promises.rm(stagedFile(this.d.stagingDir, token), { force: true });
  }

  async destroy(ref: BaseRef): Promise<void> {
    await this.d.storage.destroyBase(ref);
  }

  /** stdout and stderr go to `output` together, in the order they come, a chunk at most every
   *  quarter second (or 64 KiB), so a chatty script costs a few writes a second; past
   *  `maxLogBytes` its output is read and dropped (the script is never blocked on its log). */
  async runScript(box: BoxRecord, script: string, output: (text: string) => Promise<void>, maxLogBytes: number): Promise<{ exitCode: number; timedOut: boolean }> {
    const timeoutMs = this.d.buildTimeoutMs ?? 3_600_000;
    const { network, sourcesProxy } = this.d;
    // The package-source proxy lets this box in for the script's run only; apt and curl find it
    // in http_proxy (https_proxy too, so that an https fetch is refused at once, not left hanging).
    const open = network && sourcesProxy && box.address ? { network, proxy: sourcesProxy, address: box.address } : undefined;
    try {
      let env: Record<string, string> | undefined;
      if (open) {
        const port = await open.proxy.allow(box.id, open.address);
        const url = `http://${await open.network.openSources(box.id, open.address, port)}:${port}/`;
        env = { http_proxy: url, HTTP_PROXY: url, https_proxy: url, HTTPS_PROXY: url };
      }
      return await this.runScriptIn(box, script, output, maxLogBytes, timeoutMs, env);
    } finally {
      if (open) {
        open.proxy.disallow(box.id);
        // A rule that would not go is taken by the box's detach, which follows every build.
        await open.network.closeSources(box.id).catch(() => undefined);
      }
    }
  }

  private async runScriptIn(box: BoxRecord, script: string, output: (text: string) => Promise<void>, maxLogBytes: number, timeoutMs: number, env?: Record<string, string>): Promise<{ exitCode: number; timedOut: boolean }> {
    const proc = await this.d.runtime.execStream(box.id, { command: ['/bin/sh', '-c', script], cwd: '/', timeoutMs, ...(env ? { env } : {}) });
    crashPoint('base-build:script');
    let pending = '';
    let kept = 0;
    let cut = false;
    let flushing: Promise<void> = Promise.resolve();
    const flush = () => {
      const text = pending;
      pending = '';
      if (text) flushing = flushing.then(() => output(text)).catch(() => undefined);
    };
    const timer = setInterval(flush, 250);
    const reader = (stream: NodeJS.ReadableStream) => {
      const decoder = new StringDecoder('utf8');
      stream.on('data', (b: Buffer) => {
        if (cut) return;
        let text = decoder.write(b);
        if (kept + text.length > maxLogBytes) {
          text = `${text.slice(0, Math.max(0, maxLogBytes - kept))}\n[the log was cut at ${maxLogBytes} bytes]\n`;
          cut = true;
        }
        kept += text.length;
        pending += text;
        if (pending.length >= 64 * 1024) flush();
      });
    };
    reader(proc.stdout);
    reader(proc.stderr);
    try {
      const { exitCode, timedOut } = await proc.exited;
      // Whatever the streams still hold is part of the log.
      await Promise.all([finished(proc.stdout), finished(proc.stderr)]).catch(() => undefined);
      if (timedOut) pending += `\n[the build timed out after ${Math.round(timeoutMs / 1000)} s]\n`;
      return { exitCode, timedOut };
    } finally {
      clearInterval(timer);
      flush();
      await flushing;
    }
  }
}

/** Removes staged uploads older than `ageMs` (their import was never queued, or is long over). */
export async function dropStaleUploads(stagingDir: string, ageMs: number): Promise<void> {
  const names = await fs.promises.readdir(stagingDir).catch(() => [] as string[]);
  for (const n of names) {
    if (!/^[0-9a-f]{32}\.tar$/.test(n)) continue;
    const st = await fs.promises.stat(path.join(stagingDir, n)).catch(() => null);
    if (st && Date.now() - st.mtimeMs > ageMs) await fs.promises.rm(path.join(stagingDir, n), { force: true });
  }
}
