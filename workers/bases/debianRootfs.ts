import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { run } from '../../core/command';
import type { BaseRecipe } from '../../core/recipeBases';
import type { Logger } from '../../core/logger';
import { extractTar, type TarLimits } from './tarImport';
import { sourceLine, type AptSource } from './aptSources';
import { MAX_BASE_ENTRIES } from './tarRules';
import { mountsUnder } from '../storage/hostFs';

export const MMDEBSTRAP = '/usr/bin/mmdebstrap';

export interface DebianMakeOptions {
  /** The node's package sources for the recipe's suite (workers/bases/aptSources.ts). */
  sources: AptSource[];
  /** A directory of the node's own, emptied first and removed after (mmdebstrap's tempdir and
   *  its tarball live there). */
  workDir: string;
  timeoutMs: number;
  limits: Pick<TarLimits, 'maxUnpackedBytes'>;
  log: Logger;
}

/** A failure told in the node's words only (no host path or command line: docs/bases.md). */
export class RecipeError extends Error {}

/** Unmounts what a killed mmdebstrap left mounted under `dir` (deepest first), then removes it. */
export async function clearWorkDir(dir: string): Promise<void> {
  for (const m of mountsUnder(dir)) await run(['umount', '-l', m], { allowFailure: true });
  // Never recurse into a mount: one that would not go stops the removal.
  if (mountsUnder(dir).length > 0) throw new RecipeError('a previous attempt left mounts behind that could not be removed');
  await fs.promises.rm(dir, { recursive: true, force: true });
}

/** mmdebstrap's arguments for a recipe (root mode, a tarball, the ordinary user made by a hook). */
export function mmdebstrapArgs(recipe: BaseRecipe, sources: AptSource[], tarball: string): string[] {
  return [
    MMDEBSTRAP,
    '--mode=root',
    `--variant=${recipe.variant}`,
    `--include=${recipe.include.join(',')}`,
    '--format=tar',
    // The base's user, its home and group; its shell is bash.
    `--customize-hook=chroot "$1" useradd --create-home --user-group --uid ${recipe.user.uid} --shell /bin/bash ${recipe.user.name}`,
    // Where the node's agent is bound and where services are kept (as in every base).
    '--customize-hook=mkdir -p "$1/.boxhost" "$1/etc/boxes"',
    // Boxes get their own hostname and resolver from the node at each start.
    '--customize-hook=echo box > "$1/etc/hostname"',
    recipe.suite,
    tarball,
    ...sources.map(sourceLine),
  ];
}

/** The tail of mmdebstrap's stderr kept for the node's log. */
const STDERR_TAIL = 16 * 1024;

/**
 * Runs mmdebstrap in its own process group, so a timeout ends apt and dpkg under it too (SIGTERM
 * first, for mmdebstrap to unmount, then SIGKILL), and records the group in `pidFile` so the
 * next attempt can end what a killed worker left running before it clears the work directory.
 */
function runGroup(argv: string[], env: NodeJS.ProcessEnv, timeoutMs: number, pidFile: string): Promise<{ code: number | null; timedOut: boolean; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), { env, detached: true, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let timedOut = false;
    child.stderr!.on('data', (b: Buffer) => {
      stderr = (stderr + b.toString()).slice(-STDERR_TAIL);
    });
    const group = (sig: NodeJS.Signals) => {
      try {
        if (child.pid) process.kill(-child.pid, sig);
      } catch {
        // gone already
      }
    };
    let kill: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      timedOut = true;
      group('SIGTERM');
      kill = setTimeout(() => group('SIGKILL'), 15_000);
    }, timeoutMs);
    if (child.pid) fs.writeFileSync(pidFile, String(child.pid));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (kill) clearTimeout(kill);
      // Whatever of the group is left (a child that kept no pipe open) goes with it.
      group('SIGKILL');
      fs.rmSync(pidFile, { force: true });
      resolve({ code, timedOut, stderr });
    });
  });
}

/** Ends the process group a killed attempt left running (its pid file), if it still runs. */
function endLeftGroup(pidFile: string): void {
  let pid: number;
  try {
    pid = Number(fs.readFileSync(pidFile, 'utf8'));
  } catch {
    return;
  }
  if (Number.isInteger(pid) && pid > 1) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  fs.rmSync(pidFile, { force: true });
}

/** Why mmdebstrap failed, in the node's words only (no host, path or tool output). */
function reasonOf(recipe: BaseRecipe, r: { code: number | null; timedOut: boolean; stderr: string }, timeoutMs: number): string {
  if (r.timedOut) return `making the ${recipe.name} base took longer than ${Math.round(timeoutMs / 1000)} s (BOXHOST_BUILD_TIMEOUT_SECS)`;
  if (/Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect|Connection failed|Could not connect/i.test(r.stderr)) return `the node could not reach its Debian package sources to make the ${recipe.name} base`;
  if (/Unable to locate package|has no installation candidate/i.test(r.stderr)) return `the node's Debian package sources lack a package the ${recipe.name} base needs`;
  if (/NO_PUBKEY|not signed|is not signed|signature/i.test(r.stderr)) return `the node's Debian package sources could not be verified`;
  return `mmdebstrap could not make the ${recipe.name} base (the node's log has why)`;
}

/**
 * Fills `dir` (a new, empty base dataset) with a Debian root made by mmdebstrap from the
 * node's own package sources: the tarball it writes goes through the import rules like any
 * uploaded base (devices dropped, paths confined), so nothing mmdebstrap makes reaches the
 * base unchecked.
 */
export async function fillDebianRootfs(dir: string, recipe: BaseRecipe, o: DebianMakeOptions): Promise<void> {
  if (!fs.existsSync(MMDEBSTRAP)) throw new RecipeError('mmdebstrap is not installed on this node (scripts/install-host.sh installs it)');
  if (o.sources.length === 0) throw new RecipeError(`this node has no Debian package source for ${recipe.suite} (its apt sources, or BOXHOST_DEBIAN_SOURCES)`);
  // Beside the work directory, not in it: it outlives the clearing.
  const pidFile = `${o.workDir}.pid`;
  endLeftGroup(pidFile);
  await clearWorkDir(o.workDir);
  await fs.promises.mkdir(o.workDir, { recursive: true, mode: 0o700 });
  const tarball = path.join(o.workDir, 'rootfs.tar');
  const started = Date.now();
  try {
    const res = await runGroup(mmdebstrapArgs(recipe, o.sources, tarball), { ...process.env, TMPDIR: o.workDir, LC_ALL: 'C.UTF-8', DEBIAN_FRONTEND: 'noninteractive' }, o.timeoutMs, pidFile);
    if (res.code !== 0 || res.timedOut) {
      o.log.warn({ exitCode: res.code, timedOut: res.timedOut, stderr: res.stderr.slice(-4000) }, 'mmdebstrap failed');
      throw new RecipeError(reasonOf(recipe, res, o.timeoutMs));
    }
    o.log.info({ base: recipe.name, secs: (Date.now() - started) / 1000 }, 'mmdebstrap made the root');
    await extractTar(fs.createReadStream(tarball), dir, { maxUnpackedBytes: o.limits.maxUnpackedBytes, maxEntries: MAX_BASE_ENTRIES });
  } finally {
    await clearWorkDir(o.workDir).catch((e) => o.log.warn({ err: String(e) }, 'could not remove the base work directory'));
  }
}
