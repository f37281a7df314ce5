#!/usr/bin/env node
import { ConfigError, loadConfig } from './config';
import { startHost, Role } from './host';

/** `node dist/core/main.js [api|worker]`: both parts by default (`npm start`). */
async function main() {
  const arg = process.argv[2];
  if (arg && arg !== 'api' && arg !== 'worker') {
    process.stderr.write(`usage: boxhost [api|worker]\n`);
    process.exit(2);
  }
  let config;
  try {
    config = loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`boxhost: ${e.message}\n`);
      process.exit(2);
    }
    throw e;
  }
  const roles: Role[] = arg ? [arg as Role] : ['api', 'worker'];
  const host = await startHost(config, { roles });
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    host.log.info({ signal }, 'stopping');
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
