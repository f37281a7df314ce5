import { RECIPES } from '../../core/recipeBases';
import { readAptSources, sourceEndpoints, sourcesForSuite } from './aptSources';
import type { SourceEndpoint } from './sourcesProxy';

/**
 * The node's Debian package sources as a base build's box reaches them (docs/bases.md "Builds
 * reach the package sources"): the same entries the recipe bases are made from (the Debian
 * archives of the host's apt sources, for every recipe's suite), read again at each call so an
 * edited sources.list counts at once. Only http ones: the proxy lets requests through by host
 * name, which a TLS tunnel would hide.
 */
export class PackageSources {
  /** `places`: where the node's apt sources are read (BOXHOST_DEBIAN_SOURCES, else apt's own). */
  constructor(private readonly places?: string[]) {}

  endpoints(): SourceEndpoint[] {
    const all = readAptSources(this.places);
    const suites = [...new Set(RECIPES.map((r) => r.suite))];
    const http = suites.flatMap((suite) => sourcesForSuite(all, suite)).filter((s) => /^http:\/\//i.test(s.uri));
    return sourceEndpoints(http);
  }
}
