import crypto from 'node:crypto';
import net from 'node:net';
import type { DomainContext, Identity } from './context';
import type { CreateWebhookRequest, Webhook } from '../core/apiTypes';
import { conflict, invalidField, notFound } from '../core/errors';
import { newId, now } from '../core/ids';
import { AddressPolicy, cidrError, urlHost } from '../core/addressPolicy';
import { eventsRepo } from '../db/repos/events';
import { webhooksRepo, type WebhookRow } from '../db/repos/webhooks';
import { assertProject } from './access';
import { streamKinds } from './events';

/**
 * Webhooks (docs/packs.md "Webhooks"): registered per project (or host-wide by a token without a
 * project limit), each gets the events recorded after it was made, signed with its secret, by
 * the api's deliverer (api/webhooks.ts). A project token sees and removes only its projects'.
 */

/** The most webhooks one project (or the host-wide set) may have. */
export const MAX_WEBHOOKS = 20;

/** Deliveries failed for good in a row that disable a webhook. */
export const DISABLE_AFTER = 20;

/**
 * Where webhooks may go: never the boxes' subnet, BOXHOST_PROTECTED_NETS or the Redis and
 * database hosts given by address (whatever the allow list says); loopback, private and
 * link-local networks only when BOXHOST_WEBHOOK_ALLOW_NETS allows them.
 */
export function policyOf(config: DomainContext['config']): AddressPolicy {
  const platform = [config.boxSubnet, ...config.protectedNets];
  for (const url of [config.redisUrl, config.databaseUrl]) {
    const host = url ? urlHost(url) : '';
    if (host && net.isIP(host) && !/^127\.|^::1$/.test(host)) platform.push(host);
  }
  return new AddressPolicy({ platform: platform.filter((c) => cidrError(c) === null), allow: config.webhooks.allowNets });
}

export function toWebhook(r: WebhookRow): Webhook {
  return {
    id: r.id, url: r.url, project: r.project, kinds: r.kinds ? (JSON.parse(r.kinds) as string[]) : null, created_at: r.created_at,
    last_attempt_at: r.last_attempt_at, last_success_at: r.last_success_at, last_status: r.last_status, last_error: r.last_error,
    failures: r.failures, disabled_at: r.disabled_at,
  };
}

/** The URL's own rules: http(s), no credentials, and an address literal the policy allows. */
function checkUrl(ctx: DomainContext, raw: string): string {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw invalidField('url', 'is not a URL');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw invalidField('url', 'must be http or https');
  if (u.username || u.password) throw invalidField('url', 'must not carry credentials (the signature authenticates the sender)');
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (net.isIP(host)) {
    const why = policyOf(ctx.config).refusal(host);
    if (why) throw invalidField('url', `${why}: webhooks are not sent there (BOXHOST_WEBHOOK_ALLOW_NETS allows a network)`);
  }
  return u.toString();
}

export async function createWebhook(ctx: DomainContext, identity: Identity, req: CreateWebhookRequest): Promise<Webhook> {
  const project = req.project ?? null;
  if (project === null && identity.projects !== null) throw invalidField('project', 'a token limited to projects registers webhooks of one of them: give project');
  if (project !== null) assertProject(identity, project, `project ${project}`);
  const url = checkUrl(ctx, req.url);
  const kinds = req.kinds?.length ? streamKinds(req.kinds.join(',')) ?? null : null;
  const secret = req.secret ?? `whsec_${crypto.randomBytes(24).toString('base64url')}`;
  const row: WebhookRow = {
    id: newId('wh'), url, project, kinds: kinds ? JSON.stringify(kinds) : null, secret, after_seq: await eventsRepo.lastSeq(ctx.db),
    created_by: identity.name, token_id: identity.tokenId, failures: 0, disabled_at: null, created_at: now(), last_attempt_at: null, last_success_at: null, last_status: null, last_error: null,
  };
  // Counted as it is inserted: a registration running beside this one may take the last place.
  if (!(await webhooksRepo.insertCapped(ctx.db, row, MAX_WEBHOOKS))) throw conflict(`${project ? `project ${project}` : 'the host'} has its most webhooks (${MAX_WEBHOOKS}); remove one first`);
  return { ...toWebhook(row), secret };
}

export async function listWebhooks(ctx: DomainContext, identity: Identity): Promise<Webhook[]> {
  return (await webhooksRepo.list(ctx.db, identity.projects)).map(toWebhook);
}

export async function deleteWebhook(ctx: DomainContext, identity: Identity, id: string): Promise<void> {
  const row = await webhooksRepo.get(ctx.db, id);
  // One of another project, or a host-wide one, is not shown to a project token: 404.
  if (!row || (identity.projects !== null && (row.project === null || !identity.projects.includes(row.project)))) throw notFound(`webhook ${id}`);
  await webhooksRepo.remove(ctx.db, id);
}
