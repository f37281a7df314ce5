/** The bench's box calls through the API (each timed), and a ZFS property of a dataset. */
import { PROJECT } from './knobs';
import { spawnCollect } from './raw';
import { nowMs } from './stats';
import type { Api } from './api';

export interface CreateSample {
  name: string;
  ms: number;
  opId: string | null;
  sentAt: number;
  answeredAt: number;
  box: any;
}

export async function createBox(api: Api, name: string, extra: Record<string, unknown> = {}): Promise<CreateSample> {
  const sentAt = Date.now();
  const t0 = nowMs();
  const res = await api.call('POST', `/v1/projects/${PROJECT}/boxes?wait=60`, { name, ...extra });
  const ms = nowMs() - t0;
  const answeredAt = Date.now();
  if (res.status !== 200 || res.body?.status !== 'running') {
    throw new Error(`create ${name} answered ${res.status} (status ${res.body?.status ?? '?'}): ${res.text.slice(0, 500)}`);
  }
  return { name, ms, opId: res.headers.get('operation-id'), sentAt, answeredAt, box: res.body };
}

export async function deleteBox(api: Api, name: string): Promise<void> {
  const res = await api.call('DELETE', `/v1/projects/${PROJECT}/boxes/${name}?wait=60`);
  if (![200, 204, 404].includes(res.status)) throw new Error(`delete ${name} answered ${res.status}: ${res.text.slice(0, 300)}`);
  if (res.status === 200 && res.body?.status === 'failed') throw new Error(`delete ${name} left it failed: ${res.body.error}`);
}

export async function execApi(api: Api, box: string, command: string[], timeoutSecs?: number): Promise<{ ms: number; body: any }> {
  const t0 = nowMs();
  const res = await api.call('POST', `/v1/projects/${PROJECT}/boxes/${box}/exec`, { command, ...(timeoutSecs ? { timeout_secs: timeoutSecs } : {}) });
  const ms = nowMs() - t0;
  if (res.status !== 200) throw new Error(`exec in ${box} answered ${res.status}: ${res.text.slice(0, 500)}`);
  return { ms, body: res.body };
}

export async function zfsGet(prop: string, ds: string): Promise<string> {
  const r = await spawnCollect(['zfs', 'get', '-Hp', '-o', 'value', prop, ds]);
  if (r.code !== 0) throw new Error(`zfs get ${prop} ${ds}: ${r.stderr.trim()}`);
  return r.stdout.trim();
}
