import fs from 'node:fs';
import path from 'node:path';
import type { Config } from '../core/config';
import { newSecret } from '../domain/tokens';

export const adminTokenFile = (config: Config) => path.join(config.dataDir, 'admin-token');

/**
 * The bootstrap admin token: BOXHOST_ADMIN_TOKEN, else the one generated into the data dir
 * (mode 0600) at first start. `generated` is true only that first time, so it is printed once.
 */
export function loadAdminToken(config: Config): { token: string; generated: boolean; file?: string } {
  if (config.adminToken) return { token: config.adminToken, generated: false };
  const file = adminTokenFile(config);
  try {
    return { token: fs.readFileSync(file, 'utf8').trim(), generated: false, file };
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  const token = newSecret();
  // 'wx' fails if another process of this host won the race; then read what it wrote.
  try {
    fs.writeFileSync(file, `${token}\n`, { mode: 0o600, flag: 'wx' });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return { token: fs.readFileSync(file, 'utf8').trim(), generated: false, file };
    throw e;
  }
  return { token, generated: true, file };
}
