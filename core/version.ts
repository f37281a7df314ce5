import { execFileSync } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';

let cached: { api_version: string; version: string; commit: string } | undefined;

const root = path.resolve(__dirname, '..', '..');

/** The package version and the git commit of the running build (BOXHOST_COMMIT wins). */
export function versionInfo() {
  if (!cached) {
    const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
    let commit = process.env.BOXHOST_COMMIT ?? 'unknown';
    if (commit === 'unknown') {
      try {
        commit = execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], { cwd: root, stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
      } catch {
        // Not a checkout (an installed package): leave "unknown".
      }
    }
    cached = { api_version: 'v1', version: pkg.version, commit };
  }
  return cached;
}
