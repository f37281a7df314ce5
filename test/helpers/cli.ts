import path from 'node:path';
import { spawn } from 'node:child_process';

/** The compiled `box` CLI (this module runs as dist/test/helpers/cli.js). */
export const BOX_MAIN = path.resolve(__dirname, '..', '..', 'cli', 'main.js');

export interface BoxRun {
  code: number | null;
  stdout: string;
  /** stdout as the bytes it was (`box cat` of a binary file). */
  stdoutBytes: Buffer;
  stderr: string;
}

/** The caller's environment without its BOXHOST_* and CLI config, then `env`: nothing of the
 *  machine's own target leaks into a test's `box` run. */
export function boxEnv(env: Record<string, string | undefined>): NodeJS.ProcessEnv {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('BOXHOST_') && k !== 'XDG_CONFIG_HOME'));
  return { ...base, ...env } as NodeJS.ProcessEnv;
}

/** Runs `box ARGS` to its end, `input` (if any) on its stdin. */
export function runBox(args: string[], env: Record<string, string | undefined>, input?: Buffer): Promise<BoxRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BOX_MAIN, ...args], { env: boxEnv(env), stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => (stderr += b));
    child.on('error', reject);
    child.on('close', (code) => {
      const stdoutBytes = Buffer.concat(out);
      resolve({ code, stdout: stdoutBytes.toString('utf8'), stdoutBytes, stderr });
    });
    child.stdin.end(input);
  });
}
