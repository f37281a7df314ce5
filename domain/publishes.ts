import { EventEmitter } from 'node:events';
import { recordBoxEvent } from '../jobs/boxEvents';
import type { Publish } from '../core/apiTypes';
import { conflict, invalidField, notFound } from '../core/errors';
import { now } from '../core/ids';
import type { Db } from '../db/knex';
import { isUniqueViolation } from '../db/errors';
import { boxesRepo, BoxRecord } from '../db/repos/boxes';
import { PublishRow, publishesRepo } from '../db/repos/publishes';
import { publishRowOf, toPublish } from './publishView';
import type { DomainContext, Identity } from './context';
import { loadBox } from './boxRef';

/**
 * Publishes (DESIGN.md §4, docs/services.md "Publishing"): a port of a box, or of one of its
 * services, reached through the publish proxy at `<name>--<box>--<project>.<publish domain>`.
 * The record lives in the db (the proxy routes on it without asking the box); it survives the
 * box's stop and resume and goes with its delete.
 */

/**
 * Publish hosts changed by this process (`changed`, with the host): the proxy of the same
 * process drops its cached route at once; other processes' proxies see it within their TTL.
 */
export const publishEvents = new EventEmitter<{ changed: [host: string] }>();

/** The most publishes one box may hold (each is a row and a proxy route). */
export const MAX_PUBLISHES_PER_BOX = 100;

export interface PublishRequest {
  name: string;
  port: number;
  public?: boolean;
  force?: boolean;
  /** Set for a service's publish. */
  service?: string;
  /** Who asked (the token's name), for the box.published event. */
  who?: string;
}

/**
 * Writes a publish of `box`: 409 when its name is taken (by the box, or a service's publish
 * when `service` differs) unless `force`; a service's earlier publish (under another name) is
 * replaced, a service having at most one.
 */
export async function putPublish(ctx: Pick<DomainContext, 'db' | 'config'>, box: BoxRecord, req: PublishRequest): Promise<{ publish: Publish; replaced: boolean }> {
  if (!Number.isInteger(req.port) || req.port < 1 || req.port > 65535) throw invalidField('port', 'must be a port, 1 to 65535');
  const at = now();
  const row: PublishRow = { ...publishRowOf(ctx.config, box.name, box.project, req), box_id: box.id, project: box.project, created_at: at, updated_at: at };
  return ctx.db.transaction(async (trx: Db) => {
    // Read again in the transaction: a box whose delete has begun takes no new publish (its
    // publishes go with its row, and one written after would outlive it).
    const now = await boxesRepo.byId(trx, box.id);
    if (!now || now.status === 'deleting') throw conflict(`box ${box.project}/${box.name} is being deleted`);
    const taken = await publishesRepo.byName(trx, box.id, req.name);
    if (!taken && (await publishesRepo.ofBox(trx, box.id)).length >= MAX_PUBLISHES_PER_BOX) {
      throw conflict(`box ${box.project}/${box.name} has its most publishes (${MAX_PUBLISHES_PER_BOX}); remove one first`);
    }
    if (taken && !req.force) {
      const owner = taken.service ? `service ${taken.service}` : 'the box';
      throw conflict(`publish ${req.name} of box ${box.project}/${box.name} exists (on ${owner}, port ${taken.port}); pass force: true to replace it (box publish --force)`);
    }
    const earlier = req.service ? await publishesRepo.ofService(trx, box.id, req.service) : undefined;
    if (taken) await publishesRepo.removeHost(trx, taken.host);
    if (earlier && earlier.host !== taken?.host) await publishesRepo.removeHost(trx, earlier.host);
    try {
      await publishesRepo.insert(trx, row);
    } catch (e) {
      if (isUniqueViolation(e)) throw conflict(`publish ${req.name} of box ${box.project}/${box.name} was just made by another call`);
      throw e;
    }
    // 200 only when `force` replaced a publish of this name (DESIGN.md §6); a service's publish
    // under a new name is new (201), though it takes the place of the service's earlier one.
    return { publish: toPublish(ctx.config, row), replaced: Boolean(taken), gone: [taken?.host, earlier?.host] };
  }).then(async ({ gone, ...out }) => {
    for (const h of new Set([row.host, ...gone])) if (h) publishEvents.emit('changed', h);
    await recordBoxEvent(ctx.db, box, 'box.published', { who: req.who });
    return out;
  });
}

/** `POST …/boxes/{name}/publish`. */
export async function publishBox(ctx: DomainContext, identity: Identity, project: string, name: string, req: Omit<PublishRequest, 'service' | 'name'> & { name?: string }) {
  const box = await loadBox(ctx, identity, project, name);
  if (box.status === 'deleting') throw conflict(`box ${project}/${name} is deleting`);
  return putPublish(ctx, box, { ...req, name: req.name ?? defaultPublishName(req.port), who: identity.name });
}

/** A box publish without a name is named for its port (`p8080`): two ports never collide. */
export const defaultPublishName = (port: number) => `p${port}`;

/** `DELETE …/boxes/{name}/publish/{publish}`: a box's publish (a service's too, by its name). */
export async function unpublishBox(ctx: DomainContext, identity: Identity, project: string, name: string, publish: string): Promise<void> {
  const box = await loadBox(ctx, identity, project, name);
  const row = await publishesRepo.byName(ctx.db, box.id, publish);
  if (!row) throw notFound(`publish ${publish} of box ${project}/${name}`);
  await publishesRepo.removeHost(ctx.db, row.host);
  publishEvents.emit('changed', row.host);
}

/** A service's publish, if it has one. */
export const servicePublish = (db: Db, boxId: string, service: string) => publishesRepo.ofService(db, boxId, service);

/** Removes a service's publish; false when it had none. */
export async function removeServicePublish(db: Db, boxId: string, service: string): Promise<boolean> {
  const row = await publishesRepo.ofService(db, boxId, service);
  if (!row) return false;
  await publishesRepo.removeHost(db, row.host);
  publishEvents.emit('changed', row.host);
  return true;
}

/** Publish names follow the name rule (DESIGN.md §3). */
export { checkPublishName } from '../core/services';

/** Where the publish proxy sends a request for `host` (docs/services.md "The proxy"). */
export interface ProxyRoute {
  host: string;
  project: string;
  box: string;
  boxId: string;
  status: string;
  /** The box's address on its node's bridge (null before it first ran). */
  address: string | null;
  /** The node that holds the box. */
  node: string;
  port: number;
  public: boolean;
  service: string | null;
}

/** The route for a Host header (lowercased, without its port), or null for a host nobody published. */
export async function proxyRoute(ctx: Pick<DomainContext, 'db'>, host: string): Promise<ProxyRoute | null> {
  const row = await publishesRepo.byHost(ctx.db, host);
  if (!row) return null;
  const box = await boxesRepo.byId(ctx.db, row.box_id);
  if (!box) return null;
  return { host, project: box.project, box: box.name, boxId: box.id, status: box.status, address: box.address, node: box.node, port: row.port, public: Boolean(row.public), service: row.service };
}

/** Whether `identity` may reach a non-public publish of `project`: the rules of the api's own
 *  routes (a token limited to projects reaches only those). */
export function mayReach(identity: Identity, project: string): boolean {
  return identity.projects === null || identity.projects.includes(project);
}
