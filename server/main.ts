#!/usr/bin/env node
import './threadpool'; // first: before libuv's thread pool starts
import { ConfigError, loadConfig } from '../core/config';
import { startHost, Role } from './host';

const ROLES: Role[] = ['api', 'node', 'worker'];

/** A second signal sooner than this after the first is the same one delivered twice. */
const REPEAT_IGNORED_MS = 1000;

/** `node dist/server/main.js [api|node|worker]`: api and node together by default (`npm start`). */
async function main() {
  const arg = process.argv[2];
  if (arg && !ROLES.includes(arg as Role)) {
    process.stderr.write(`usage: boxhost [${ROLES.join('|')}]\n`);
    process.exit(2);
  }
  const roles: Role[] = arg ? [arg as Role] : ['api', 'node'];
  let host;
  try {
    host = await startHost(loadConfig(), { roles });
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`boxhost: ${e.message}\n`);
      process.exit(2);
    }
    throw e;
  }
  let stopping = 0;
  const stop = async (signal: string) => {
    // `npm start` forwards the terminal's Ctrl-C, which the whole process group got too: the
    // same press arrives twice within a moment, and is one request to stop.
    if (stopping && Date.now() - stopping < REPEAT_IGNORED_MS) return;
    if (stopping) {
      // A second signal: the operations under way are left as a killed worker leaves them; the
      // next start picks them up again (every job step is idempotent).
      host.log.warn({ signal }, 'stopping now: operations under way resume at the next start');
      process.exit(1);
    }
    stopping = Date.now();
    host.log.info({ signal }, 'stopping: requests under way get 2 s, running operations are let finish (signal again to stop at once; they resume at the next start)');
    process.stderr.write(`boxhost: stopping; waiting for running operations to finish (${signal} again to stop at once: they resume at the next start)\n`);
    await host.close();
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
}

main().catch((e) => {
  process.stderr.write(`boxhost: failed to start: ${(e as Error).message}\n`);
  process.exit(1);
});
