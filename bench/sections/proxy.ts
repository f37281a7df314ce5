/**
 * 2c. the publish proxy against the box's address (issue 10), with Go's reverse proxy as a
 *     reference; and a deploy under load through the proxy (issue 12).
 */
import { CreateSample } from '../boxes';
import { benchDeploy } from '../deploy';
import { PROJECT } from '../knobs';
import { benchProxy } from '../proxy';
import { round1 } from '../stats';
import type { SectionContext } from './context';

export async function proxySection(ctx: SectionContext, target: CreateSample): Promise<void> {
  const { api, host, config, knobs, profiler, notes, results, progress, checkpoint } = ctx;
  checkpoint();
  profiler.phase = 'proxy';
  progress(`proxy: a keep-alive Go server in a box, ${knobs.proxyRounds}× ${knobs.proxySecs} s of autocannon -c ${knobs.proxyConns} straight at the box and through the publish proxy`);
  const address = (await api.call('GET', `/v1/projects/${PROJECT}/boxes/${target.name}`)).body.address as string;
  const px = await benchProxy({ api, project: PROJECT, box: target.name, address, proxyUrl: host.proxyUrl!, scratch: config.dataDir, seconds: knobs.proxySecs, rounds: knobs.proxyRounds, connections: knobs.proxyConns });
  const rateRatio = px.proxied.rps / px.direct.rps;
  const addedP99 = px.proxied.p99 - px.direct.p99;
  const refRatio = px.reference.rps / px.direct.rps;
  results.proxy = { direct: px.direct, proxied: px.proxied, reference_go_reverse_proxy: px.reference, rate_ratio: round1(rateRatio * 100) / 100, reference_rate_ratio: round1(refRatio * 100) / 100, added_p99_ms: round1(addedP99), connections: knobs.proxyConns };
  notes.push(`publish proxy: ${px.proxied.rps.toFixed(0)} req/s vs ${px.direct.rps.toFixed(0)} straight to the box (${rateRatio.toFixed(2)}×, target ≥ 0.7× ${rateRatio >= 0.7 ? 'PASS' : 'MISS'}); p99 ${px.proxied.p99.toFixed(1)} vs ${px.direct.p99.toFixed(1)} ms (+${addedP99.toFixed(1)} ms, target ≤ 2 ms ${addedP99 <= 2 ? 'PASS' : 'MISS'}), autocannon -c ${knobs.proxyConns}`);
  notes.push(`publish proxy, reference: Go's standard-library reverse proxy (bench/refproxy) under the same load: ${px.reference.rps.toFixed(0)} req/s (${refRatio.toFixed(2)}× direct), p99 +${(px.reference.p99 - px.direct.p99).toFixed(1)} ms`);
  progress(`proxy done: ${px.proxied.rps.toFixed(0)}/${px.direct.rps.toFixed(0)} req/s (proxy/direct), p99 +${addedP99.toFixed(1)} ms; Go reverse proxy ${px.reference.rps.toFixed(0)} req/s`);
}

/** A pack instance under load through the proxy while a new revision is deployed. */
export async function deploySection(ctx: SectionContext): Promise<void> {
  const { api, host, knobs, profiler, notes, results, progress, checkpoint } = ctx;
  checkpoint();
  profiler.phase = 'deploy';
  progress(`deploy: a pack instance under ${knobs.deploySecs} s of autocannon -c ${knobs.proxyConns} through the proxy while a new revision is deployed`);
  const dp = await benchDeploy({ api, project: PROJECT, proxyUrl: host.proxyUrl!, seconds: knobs.deploySecs, connections: knobs.proxyConns });
  results.deploy = dp;
  const lost = dp.non2xx + dp.errors + dp.timeouts;
  notes.push(`deploy under load: ${dp.requests} requests through the proxy in ${dp.seconds} s, ${lost} lost (${dp.non2xx} non-2xx, ${dp.errors} errors; target 0 ${lost === 0 ? 'PASS' : 'MISS'}); the deploy took ${dp.deploy_ms} ms from request to switch`);
  progress(`deploy done: ${dp.requests} requests, ${lost} lost, ${dp.deploy_ms} ms to switch`);
}
