/**
 * Service supervision calls to a box's boxd (docs/boxd.md, "Services"): boxd keeps the specs in
 * the box at /etc/boxes/services/<name>.json, starts them when the box starts, restarts them by
 * policy with backoff and logs their output with rotation. Everything it answers is checked.
 */
import type { Readable } from 'node:stream';
import type { BoxdClient } from './client';
import type { BoxProbe, BoxProbeResult, BoxServiceSpec, BoxServiceState, BoxServiceStateName } from '../../drivers';
import { SERVICE_STATES } from '../../drivers';
import { BOXD_PROTOCOL, BoxdProtocolError, encodeFrame, Frame, frameJson, intField, textField } from './protocol';
import { BoxAgentUnavailableError, BoxNeedsRestartError } from '../../errors';

/** A stop's grace is at most an hour (boxd refuses more): what a call that stops may wait. */
const MAX_GRACE_MS = 3_600_000;

/** The most services a listing may answer. */
const MAX_SERVICES = 10_000;

function serviceState(o: Record<string, unknown>): BoxServiceState {
  const state = o.state;
  if (!SERVICE_STATES.includes(state as BoxServiceStateName)) throw new BoxdProtocolError(`boxd sent service state ${JSON.stringify(state)}`);
  const name = o.name;
  if (typeof name !== 'string' || !/^[a-z0-9][a-z0-9-]{0,62}$/.test(name)) throw new BoxdProtocolError(`boxd sent a service name that is not one`);
  const out: BoxServiceState = {
    name,
    state: state as BoxServiceStateName,
    pid: intField(o, 'pid', 0, 4_194_304, 0),
    restarts: intField(o, 'restarts', 0, 2 ** 31, 0),
    lastExitCode: o.last_exit_code === undefined || o.last_exit_code === null ? null : intField(o, 'last_exit_code', 0, 255),
  };
  if (typeof o.error === 'string') out.error = textField(o, 'error', 1000);
  if (o.spec !== undefined && o.spec !== null) {
    if (typeof o.spec !== 'object' || Array.isArray(o.spec)) throw new BoxdProtocolError('boxd sent a spec that is not an object');
    out.spec = o.spec as Record<string, unknown>;
  }
  return out;
}

function checked<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof BoxdProtocolError) throw new BoxAgentUnavailableError(`boxd broke the protocol: ${e.message}`);
    throw e;
  }
}

/** The service calls of one box's boxd. */
export class BoxdServices {
  constructor(private readonly client: BoxdClient) {}

  /** `waitMs`: how long the call may take in the box (a stop's grace) beyond the answer timeout. */
  private async one(body: object, waitMs = 0): Promise<Record<string, unknown>> {
    return frameJson(await this.client.request(encodeFrame(Frame.service, { v: BOXD_PROTOCOL, ...body }), Frame.answer, undefined, this.client.timeoutMs + waitMs));
  }

  /** Starts `spec` (replacing the service of that name): 400 errors for a bad field, an unknown
   *  user, a missing cwd or command, with nothing changed. */
  async start(spec: BoxServiceSpec): Promise<{ service: BoxServiceState; replaced: boolean }> {
    const o = await this.one({ op: 'start', name: spec.name, spec }, MAX_GRACE_MS);
    return checked(() => {
      if (typeof o.service !== 'object' || o.service === null) throw new BoxdProtocolError('boxd sent a start answer without a service');
      return { service: serviceState(o.service as Record<string, unknown>), replaced: o.replaced === true };
    });
  }

  /** Starts the stored spec again if it does not run (and enables it). */
  async resume(name: string): Promise<BoxServiceState> {
    const o = await this.one({ op: 'start', name });
    return checked(() => serviceState(o));
  }

  async restart(name: string): Promise<BoxServiceState> {
    const o = await this.one({ op: 'restart', name }, MAX_GRACE_MS);
    return checked(() => serviceState(o));
  }

  /** Stops it (the spec's signal and grace unless given, then SIGKILL) and keeps it stopped
   *  across the box's restarts until it is started again. */
  async stop(name: string, opts: { signal?: string; graceMs?: number; fail?: string } = {}): Promise<BoxServiceState> {
    const o = await this.one({ op: 'stop', name, signal: opts.signal, graceMs: opts.graceMs, fail: opts.fail?.slice(0, 4000) }, opts.graceMs ?? MAX_GRACE_MS);
    return checked(() => serviceState(o));
  }

  /** One look at a port inside the box (its own loopback); a boxd before 1.2.0 has no probes. */
  async probe(p: BoxProbe): Promise<BoxProbeResult> {
    if (!(await this.client.atLeast(1, 2))) throw new BoxNeedsRestartError('the box\'s agent (boxd) predates ready gates: stop and resume the box to use them');
    const o = await this.one({ op: 'probe', probe: p });
    return checked(() => {
      if (typeof o.ok !== 'boolean') throw new BoxdProtocolError('boxd sent a probe answer without ok');
      return o.ok ? { ok: true } : { ok: false, issue: o.issue === undefined ? 'not ready' : textField(o, 'issue', 1000) };
    });
  }

  async get(name: string): Promise<BoxServiceState> {
    const o = await this.one({ op: 'get', name });
    return checked(() => serviceState(o));
  }

  async list(): Promise<BoxServiceState[]> {
    const all = await this.client.requestMany(encodeFrame(Frame.service, { v: BOXD_PROTOCOL, op: 'list' }), MAX_SERVICES);
    return checked(() => all.map(serviceState));
  }

  /** Stops it and removes its spec and logs (also how a corrupt spec's tombstone goes). */
  async remove(name: string): Promise<void> {
    await this.client.request(encodeFrame(Frame.service, { v: BOXD_PROTOCOL, op: 'delete', name }), Frame.ok, undefined, this.client.timeoutMs + MAX_GRACE_MS);
  }

  /** The last `tail` lines of its log, then with `follow` what it writes next, until `data` is
   *  destroyed. */
  async logs(name: string, opts: { tail?: number; follow?: boolean } = {}): Promise<Readable> {
    const { data } = await this.client.openStream(encodeFrame(Frame.service, { v: BOXD_PROTOCOL, op: 'logs', name, tail: opts.tail, follow: opts.follow === true }), () => null);
    return data;
  }
}
