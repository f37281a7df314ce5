import crypto from 'node:crypto';
import type { Db } from '../db/knex';
import type { PackRevisionSpec } from '../core/apiTypes';
import type { Config } from '../core/config';
import { publishUrl } from '../core/services';
import { boxesRepo, type BoxRecord } from '../db/repos/boxes';
import { deploysRepo } from '../db/repos/deploys';
import { packsRepo } from '../db/repos/packs';
import { publishesRepo } from '../db/repos/publishes';
import { outputsRepo, secretOwner, type EnvLinkRow } from '../db/repos/outputs';

/**
 * Pack outputs (docs/packs.md "Outputs and env_from"): templates over an instance, rendered for
 * the boxes that name it in `env_from` at their create and again at each of their starts, so a
 * changed output (a new address, a deploy, a re-published URL) reaches them at their next
 * start. Shared by the api (create) and the node (start), hence here, above the db.
 *
 * `{{name}}`, `{{project}}`, `{{address}}`, `{{node}}`, `{{pack}}`, `{{rev}}`; `{{host.<publish>}}`
 * and `{{url.<publish>}}` of the instance's publishes; `{{port.<service>}}` of its revision's
 * services; `{{secret.<name>}}`, a random value made once per instance and name and kept. Anything
 * else is left as written.
 */

const TEMPLATE = /\{\{\s*([a-z_]+)(?:\.([A-Za-z0-9_-]{1,64}))?\s*\}\}/g;

/** What a template may name of an instance, read once per render. */
interface Scope {
  box: BoxRecord;
  spec: PackRevisionSpec;
  hosts: Map<string, string>;
  proxyPort: number;
}

async function scopeOf(db: Db, box: BoxRecord, proxyPort: number): Promise<Scope | null> {
  if (!box.pack || !box.pack_rev) return null;
  const rev = await packsRepo.revision(db, box.pack, box.pack_rev);
  if (!rev) return null;
  const hosts = new Map((await publishesRepo.ofBox(db, box.id)).map((p) => [p.name, p.host]));
  return { box, spec: JSON.parse(rev.content) as PackRevisionSpec, hosts, proxyPort };
}

/** The instance's secret `name`, made at its first use (two at once agree on the first kept).
 *  The generations of a deploy line share the line's (outputsRepo.secretOwner). */
async function secretOf(db: Db, box: BoxRecord, name: string): Promise<string> {
  const gen = await deploysRepo.generationOf(db, box.id);
  const owner = gen ? secretOwner(gen.project, gen.line) : box.id;
  const had = await outputsRepo.secret(db, owner, name);
  if (had !== undefined) return had;
  await outputsRepo.putSecret(db, owner, name, crypto.randomBytes(24).toString('base64url'));
  return (await outputsRepo.secret(db, owner, name))!;
}

/** Renders `template` over the instance of `scope`. */
export async function renderTemplate(db: Db, scope: Scope, template: string): Promise<string> {
  const { box } = scope;
  const plain: Record<string, string> = { name: box.name, project: box.project, address: box.address ?? '', node: box.node, pack: box.pack ?? '', rev: box.pack_rev ?? '' };
  const parts: Promise<string>[] = [];
  template.replace(TEMPLATE, (whole, k: string, sub: string | undefined) => {
    parts.push((async () => {
      if (sub === undefined) return Object.hasOwn(plain, k) ? plain[k] : whole;
      if (k === 'host') return scope.hosts.get(sub) ?? whole;
      if (k === 'url') {
        const host = scope.hosts.get(sub);
        return host ? publishUrl({ proxyPort: scope.proxyPort }, host) : whole;
      }
      if (k === 'port') {
        const port = (scope.spec.services ?? []).find((s) => s.name === sub)?.port;
        return port !== undefined ? String(port) : whole;
      }
      if (k === 'secret') return secretOf(db, box, sub);
      return whole;
    })());
    return whole;
  });
  const values = await Promise.all(parts);
  let i = 0;
  return template.replace(TEMPLATE, () => values[i++]);
}

/** The variable an output `key` of the instance linked as `alias` becomes (`STORE_HOST`). */
export const linkedName = (alias: string, key: string) => `${alias.toUpperCase()}_${key}`;

/** The instance `box` names in its project: the live generation when it names a deployed line. */
export async function resolveInstance(db: Db, project: string, name: string): Promise<BoxRecord | undefined> {
  const line = await deploysRepo.line(db, project, name);
  if (line) return boxesRepo.byId(db, line.live_box_id);
  return boxesRepo.get(db, project, name);
}

/** An instance's outputs, rendered (null: not an instance). */
export async function outputsOf(db: Db, box: BoxRecord, config: Pick<Config, 'proxyPort'>): Promise<Record<string, string> | null> {
  const scope = await scopeOf(db, box, config.proxyPort);
  if (!scope) return null;
  const out: Record<string, string> = {};
  for (const [key, template] of Object.entries(scope.spec.outputs ?? {})) out[key] = await renderTemplate(db, scope, template);
  return out;
}

/** Whether a value names a per-instance secret (a service's env: its key is then redacted). */
export const namesSecret = (value: string) => /\{\{\s*secret\./.test(value);

/** The instance's own templates in values it is given (its services' `env`). */
export async function renderOwn(db: Db, box: BoxRecord, config: Pick<Config, 'proxyPort'>, values: Record<string, string>): Promise<Record<string, string>> {
  const scope = await scopeOf(db, box, config.proxyPort);
  if (!scope) return values;
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(values)) out[k] = await renderTemplate(db, scope, v);
  return out;
}

/**
 * At a box's start: its `env_from` links rendered again; each variable a link supplied (and the
 * box's own environment did not set at create) takes the output's current value, a variable of
 * an output that is gone goes. A source that is gone or no longer an instance keeps the values
 * it last gave. Answers the environment to start with, written back to the box's row.
 */
export async function refreshLinkedEnv(db: Db, box: BoxRecord, config: Pick<Config, 'proxyPort'>): Promise<Record<string, string>> {
  const links = await outputsRepo.links(db, box.id);
  if (links.length === 0) return box.environment;
  const env = { ...box.environment };
  const changed: EnvLinkRow[] = [];
  for (const link of links) {
    const source = await resolveInstance(db, box.project, link.source);
    const outputs = source ? await outputsOf(db, source, config) : null;
    if (!outputs) continue;
    const had = JSON.parse(link.keys) as string[];
    const now: string[] = [];
    const skip = new Set(JSON.parse(link.own) as string[]);
    for (const [key, value] of Object.entries(outputs)) {
      const name = linkedName(link.alias, key);
      if (skip.has(name)) continue;
      env[name] = value;
      now.push(name);
    }
    for (const name of had) if (!now.includes(name)) delete env[name];
    if (JSON.stringify(now) !== link.keys) changed.push({ ...link, keys: JSON.stringify(now) });
  }
  if (JSON.stringify(env) !== JSON.stringify(box.environment)) await boxesRepo.update(db, box.id, { environment: env });
  for (const l of changed) await outputsRepo.updateKeys(db, l.box_id, l.position, l.keys);
  return env;
}
