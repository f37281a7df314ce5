import type { Readable } from 'node:stream';
import type { DomainContext, Identity } from './context';
import type { NodeServiceState } from '../cluster/types';
import type { Publish, Service, ServiceStartRequest } from '../core/apiTypes';
import { conflict, invalidField, notFound } from '../core/errors';
import { checkStart, specOf } from '../core/services';
export { READY_TIMEOUT_DEFAULT_S, checkStart } from '../core/services';
import { publishesRepo } from '../db/repos/publishes';
import type { BoxRecord } from '../db/repos/boxes';
import { runningBox } from './boxNode';
import { loadBox } from './boxRef';
import { checkPublishName, putPublish, removeServicePublish } from './publishes';
import { toPublish } from './publishView';
import { serviceCommands } from './serviceCommands';

/**
 * Services (spec "Service", DESIGN.md §4 and §6 "Services", docs/services.md): supervised by
 * boxd inside the box, reached through the box's node. Here: who may, which box, the rules of a
 * start (secret_env, publish, ready), and the Service record made from what the box reports.
 */

const need = (ctx: DomainContext, identity: Identity, project: string, name: string) => runningBox(ctx, identity, project, name, 'services');

/** The spec as the box holds it, read back with the types the api wrote (root in the box can
 *  edit the file: a field of another type is dropped, not believed). */
function specFields(spec: Record<string, unknown> | undefined) {
  const s = spec ?? {};
  const str = (v: unknown) => (typeof v === 'string' ? v : undefined);
  const strings = (v: unknown) => (Array.isArray(v) && v.every((x) => typeof x === 'string') ? (v as string[]) : undefined);
  const map = (v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) && Object.values(v).every((x) => typeof x === 'string') ? (v as Record<string, string>) : undefined);
  const int = (v: unknown, max = 2 ** 31) => (Number.isInteger(v) && (v as number) >= 0 && (v as number) <= max ? (v as number) : undefined);
  const port = (v: unknown) => (int(v, 65535) || undefined);
  const obj = (v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined);
  const ready = obj(s.ready);
  const stop = obj(s.stop);
  const publish = obj(s.publish);
  const req: ServiceStartRequest = {
    name: str(s.name) ?? '',
    command: strings(s.command) ?? [],
    cwd: str(s.cwd),
    env: map(s.env),
    user: str(s.user),
    restart: (['always', 'on-failure', 'never'] as const).find((r) => r === s.restart),
    port: port(s.port),
    secret_env: strings(s.secret_env),
    tags: map(s.tags),
    ready: ready && { http: str(ready.http), port: port(ready.port), status: int(ready.status, 599), tcp: port(ready.tcp), timeout_secs: int(ready.timeout_secs, 600) },
    stop: stop && { signal: str(stop.signal), grace_secs: int(stop.grace_secs, 3600) },
    publish: publish && { name: str(publish.name), public: typeof publish.public === 'boolean' ? publish.public : undefined },
  };
  return req;
}

/** The Service record: the box's word on its state, the spec's fields, the publish's url. */
export function toService(box: BoxRecord, st: NodeServiceState, publish?: Publish): Service {
  if (st.state === 'corrupt') {
    return { name: st.name, command: [], commands: { start: '', publish: '', unpublish: '' }, restart: 'always', restarts: st.restarts, state: 'corrupt', error: st.error ?? 'the spec did not load', pid: 0, port: 0, tags: {}, user: '' };
  }
  const spec = specFields(st.spec);
  const out: Service = {
    name: st.name,
    command: spec.command,
    commands: serviceCommands(box, { ...spec, name: st.name }, publish),
    restart: spec.restart ?? 'always',
    restarts: st.restarts,
    state: st.state,
    pid: st.pid,
    port: spec.port ?? 0,
    tags: spec.tags ?? {},
    user: spec.user ?? 'root',
  };
  if (st.lastExitCode !== null) out.last_exit_code = st.lastExitCode;
  if (publish) out.url = publish.url;
  if (publish?.warning) out.warning = publish.warning;
  return out;
}

async function publishOf(ctx: DomainContext, box: BoxRecord, service: string): Promise<Publish | undefined> {
  const row = await publishesRepo.ofService(ctx.db, box.id, service);
  return row ? toPublish(ctx.config, row) : undefined;
}

/**
 * `POST …/services`: starts (or replaces) a service and, with `ready`, answers once its gate
 * passed. A publish is checked before anything starts (a name taken elsewhere is 409 with
 * nothing started) and written once the service is up.
 */
export async function startService(ctx: DomainContext, identity: Identity, project: string, name: string, req: ServiceStartRequest): Promise<{ service: Service; replaced: boolean }> {
  const gate = checkStart(req);
  const { box, id, node } = await need(ctx, identity, project, name);
  const publishName = req.publish ? (req.publish.name ?? req.name) : undefined;
  if (publishName) {
    const taken = await publishesRepo.byName(ctx.db, id, publishName);
    if (taken && taken.service !== req.name) throw conflict(`publish ${publishName} of box ${project}/${name} is taken (by ${taken.service ? `service ${taken.service}` : 'the box'}); choose another publish name`);
  }
  const started = await node.serviceStart(id, specOf(req), gate);
  let publish: Publish | undefined;
  if (publishName) {
    publish = (await putPublish(ctx, box, { name: publishName, port: req.port!, public: req.publish!.public, force: true, service: req.name, who: identity.name })).publish;
  } else if (started.replaced) {
    // The service it replaced may have been published: a start without `publish` says it is not.
    await removeServicePublish(ctx.db, id, req.name);
  }
  return { service: toService(box, started.service, publish), replaced: started.replaced };
}

export async function listServices(ctx: DomainContext, identity: Identity, project: string, name: string): Promise<Service[]> {
  const { box, id, node } = await need(ctx, identity, project, name);
  const [states, rows] = await Promise.all([node.serviceList(id), publishesRepo.ofBox(ctx.db, id)]);
  return states.map((st) => {
    const row = rows.find((r) => r.service === st.name);
    return toService(box, st, row ? toPublish(ctx.config, row) : undefined);
  });
}

export async function getService(ctx: DomainContext, identity: Identity, project: string, name: string, service: string): Promise<Service> {
  const { box, id, node } = await need(ctx, identity, project, name);
  return toService(box, await node.serviceGet(id, service), await publishOf(ctx, box, service));
}

export async function controlService(ctx: DomainContext, identity: Identity, project: string, name: string, service: string, action: 'start' | 'stop' | 'restart', opts: { signal?: string; grace_secs?: number } = {}): Promise<Service> {
  const { box, id, node } = await need(ctx, identity, project, name);
  const graceMs = opts.grace_secs === undefined ? undefined : opts.grace_secs * 1000;
  const st = await node.serviceControl(id, service, action, { signal: opts.signal, graceMs });
  return toService(box, st, await publishOf(ctx, box, service));
}

/** Stops it, removes its spec and logs in the box, and its publish. */
export async function deleteService(ctx: DomainContext, identity: Identity, project: string, name: string, service: string): Promise<void> {
  const { id, node } = await need(ctx, identity, project, name);
  await node.serviceDelete(id, service);
  await removeServicePublish(ctx.db, id, service);
}

export async function serviceLogs(ctx: DomainContext, identity: Identity, project: string, name: string, service: string, opts: { tail?: number; follow?: boolean }): Promise<Readable> {
  const { id, node } = await need(ctx, identity, project, name);
  return node.serviceLogs(id, service, opts);
}

/** `POST …/services/{service}/publish`: its port under `name` (default: the service's name). */
export async function publishService(ctx: DomainContext, identity: Identity, project: string, name: string, service: string, req: { name?: string; public?: boolean; force?: boolean }): Promise<{ publish: Publish; replaced: boolean }> {
  const { box, id, node } = await need(ctx, identity, project, name);
  const st = await node.serviceGet(id, service);
  if (st.state === 'corrupt') throw conflict(`service ${service} has a spec that does not load (${st.error ?? 'corrupt'}); start it again first`);
  const port = specFields(st.spec).port;
  if (!port) throw invalidField('port', `service ${service} has no port to publish; start it again with one`);
  return putPublish(ctx, box, { name: checkPublishName(req.name ?? service), port, public: req.public, force: req.force, service, who: identity.name });
}

export async function unpublishService(ctx: DomainContext, identity: Identity, project: string, name: string, service: string): Promise<void> {
  // The db's record only: a stopped box's publish goes too.
  const box = await loadBox(ctx, identity, project, name);
  if (!(await removeServicePublish(ctx.db, box.id, service))) throw notFound(`publish of service ${service} in box ${project}/${name}`);
}
