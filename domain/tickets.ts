import crypto from 'node:crypto';
import type IORedis from 'ioredis';
import type { Db } from '../db/knex';
import { tokensRepo } from '../db/repos/tokens';
import type { Ticket } from '../core/apiTypes';
import type { Identity } from './context';
import { ADMIN_TOKEN_ID } from './tokens';

/**
 * WebSocket tickets (DESIGN.md §4, §6): a browser cannot set headers on a WebSocket, so it asks
 * `POST /v1/tickets` with its token and connects with `?ticket=`. A ticket is bound to the
 * identity that asked (its project limits come with it), lives TICKET_TTL_MS, and works for one
 * handshake: redeeming deletes it (GETDEL, atomic across api processes). Only its hash is kept.
 * The token behind it is looked at again when it is used: a token revoked meanwhile makes it
 * worthless. Long-lived tokens never travel in URLs.
 */
export const TICKET_TTL_MS = 30_000;

export interface TicketStore {
  issue(identity: Identity): Promise<Ticket>;
  /** The identity a ticket was issued to, once; null for an unknown, used or expired one. */
  redeem(ticket: string): Promise<Identity | null>;
}

const hash = (s: string) => crypto.createHash('sha256').update(s).digest('hex');
const TICKET_RE = /^bxk_[A-Za-z0-9_-]{43}$/;

/** Tickets in Redis; while Redis does not answer, in this process's memory (a ticket then works
 *  only on the api process that issued it). */
export class RedisTickets implements TicketStore {
  private readonly local = new Map<string, { identity: Identity; expires: number }>();

  constructor(
    private readonly db: Db,
    private readonly redis: IORedis,
    private readonly prefix: string,
  ) {}

  private key(ticket: string): string {
    return `${this.prefix}:ticket:${hash(ticket)}`;
  }

  async issue(identity: Identity): Promise<Ticket> {
    const ticket = `bxk_${crypto.randomBytes(32).toString('base64url')}`;
    const expires = Date.now() + TICKET_TTL_MS;
    try {
      await this.redis.set(this.key(ticket), JSON.stringify(identity), 'PX', TICKET_TTL_MS);
    } catch {
      this.sweep();
      this.local.set(hash(ticket), { identity, expires });
    }
    return { ticket, expires_at: new Date(expires).toISOString() };
  }

  async redeem(ticket: string): Promise<Identity | null> {
    if (!TICKET_RE.test(ticket)) return null;
    let identity: Identity | null = null;
    const mine = this.local.get(hash(ticket));
    if (mine) {
      this.local.delete(hash(ticket));
      // Its SET may have reached Redis with the answer lost: that copy goes too.
      await this.redis.del(this.key(ticket)).catch(() => undefined);
      if (mine.expires > Date.now()) identity = mine.identity;
    } else {
      try {
        const raw = await this.redis.getdel(this.key(ticket));
        identity = raw ? (JSON.parse(raw) as Identity) : null;
      } catch {
        return null;
      }
    }
    if (!identity) return null;
    return (await this.stillValid(identity)) ? identity : null;
  }

  /** The token behind the ticket still exists and has not expired. */
  private async stillValid(identity: Identity): Promise<boolean> {
    if (identity.tokenId === ADMIN_TOKEN_ID) return true;
    const row = await tokensRepo.byId(this.db, identity.tokenId);
    return !!row && !(row.expires_at && Date.parse(row.expires_at) <= Date.now());
  }

  private sweep(): void {
    const now = Date.now();
    for (const [k, v] of this.local) if (v.expires <= now) this.local.delete(k);
  }
}
