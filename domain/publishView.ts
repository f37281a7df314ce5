import type { Config } from '../core/config';
import type { Publish } from '../core/apiTypes';
import type { PublishRow } from '../db/repos/publishes';
import { idpConfigured } from './authSettings';
import { publishHost, publishUrl } from '../core/services';

export { publishHost, publishUrl };

/** How publishes are shown (the Publish record, its host and url, a box's url_settings). */

/** Said on a publish asked non-public when no identity provider is configured (spec, Auth 4). */
export const PUBLIC_FALLBACK_WARNING = 'no auth provider is configured: this publish is public (anyone who knows its URL reaches it); configure BOXHOST_OIDC_* to require sign-in or a token';

/** The row of a publish of box `box` (its host name's middle part): a non-public one falls back
 *  to public, with the warning, when no identity provider is configured. */
export function publishRowOf(config: Config, box: string, project: string, req: { name: string; port: number; public?: boolean; service?: string }) {
  const fallback = req.public === false && !idpConfigured(config);
  return {
    host: publishHost(config, req.name, box, project),
    name: req.name,
    port: req.port,
    public: req.public !== false || fallback,
    service: req.service ?? null,
    warning: fallback ? PUBLIC_FALLBACK_WARNING : null,
  };
}

export function toPublish(config: Config, r: PublishRow): Publish {
  const out: Publish = { name: r.name, host: r.host, port: r.port, public: Boolean(r.public), url: publishUrl(config, r.host) };
  if (r.warning) out.warning = r.warning;
  return out;
}

/** `url_settings.auth` of a box: how its non-public publishes are guarded (docs/services.md). */
export const urlSettings = (config: Config) => ({ auth: idpConfigured(config) ? 'bearer' : 'none' });

