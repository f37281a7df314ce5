import path from 'node:path';
import { spawnCollect } from './raw';
import type { Api } from './api';

/**
 * A deploy under load (issue 12, docs/packs.md "Deploy generations"): a pack instance serving
 * busybox httpd through the publish proxy takes autocannon's steady load while a new revision is
 * deployed and the line's publish switches to it. The figure is what the load saw: requests,
 * non-2xx answers and errors (the target is none lost), and how long the deploy took from the
 * request to the switch.
 */

export interface DeployFigure {
  requests: number;
  non2xx: number;
  errors: number;
  timeouts: number;
  rps: number;
  /** From the deploy request to its operation's end (the switch). */
  deploy_ms: number;
  seconds: number;
}

const ROOT = path.resolve(__dirname, '..', '..');
const AUTOCANNON = path.join(ROOT, 'node_modules', 'autocannon', 'autocannon.js');

const revision = (text: string) => ({
  base: 'bench-site-base',
  parent: 'busybox',
  script: 'mkdir -p /srv',
  services: [{
    name: 'web',
    command: ['sh', '-c', `mkdir -p /run/www && echo ${text} > /run/www/index.html && exec httpd -f -p 8080 -h /run/www`],
    port: 8080,
    ready: { http: '/index.html', timeout_secs: 30 },
    publish: { name: 'web' },
  }],
});

export async function benchDeploy(opts: { api: Api; project: string; proxyUrl: string; seconds: number; connections: number }): Promise<DeployFigure> {
  const { api, project } = opts;
  const P = `/v1/projects/${project}/boxes`;
  const pack = await api.call('POST', '/v1/packs', { name: 'bench-site', default_rev: 'v1', revisions: { v1: revision('v1'), v2: revision('v2') } });
  if (pack.status !== 201) throw new Error(`installing the bench pack failed: ${pack.text}`);
  const made = await api.call('POST', `${P}?wait=300`, { name: 'site', pack: 'bench-site' });
  if (made.body?.status !== 'running') throw new Error(`the bench instance did not start: ${made.text}`);
  const host = new URL(made.body.publishes[0].url).hostname;
  try {
    const load = spawnCollect([process.execPath, AUTOCANNON, '--json', '-c', String(opts.connections), '-d', String(opts.seconds), '-H', `host=${host}`, `${opts.proxyUrl}/index.html`]);
    // The deploy lands in the middle of the load.
    await new Promise((r) => setTimeout(r, Math.min(2000, (opts.seconds * 1000) / 4)));
    const t0 = performance.now();
    const d = await api.call('POST', `${P}/site/deploy?wait=120`, { rev: 'v2' });
    const deployMs = performance.now() - t0;
    if (d.status !== 200) throw new Error(`the deploy did not finish: ${d.text}`);
    const o = JSON.parse((await load).stdout);
    return { requests: o.requests.total, non2xx: o.non2xx, errors: o.errors, timeouts: o.timeouts, rps: o.requests.average, deploy_ms: Math.round(deployMs), seconds: opts.seconds };
  } finally {
    for (const b of ['site-g2', 'site']) await api.call('DELETE', `${P}/${b}?wait=120`);
    await api.call('DELETE', '/v1/packs/bench-site');
  }
}
