import fs from 'node:fs';
import path from 'node:path';

/**
 * The node's own Debian package sources (docs/bases.md "The debian base"): the `deb` entries of
 * apt's sources on the host, one-line (`.list`) and deb822 (`.sources`) alike, kept only where
 * they serve the recipe's suite (`bookworm`, `bookworm-updates`, `bookworm-security` …), so a
 * third-party repository on the host never reaches a base.
 */
export interface AptSource {
  uri: string;
  suite: string;
  components: string[];
  /** A keyring path (`Signed-By`/`signed-by=`), when the entry names one. */
  signedBy?: string;
}

export const HOST_APT_SOURCES = ['/etc/apt/sources.list', '/etc/apt/sources.list.d'];

/** Every `deb` entry of one file's text (`format` from its name: `.sources` is deb822). */
export function parseAptSources(text: string, format: 'list' | 'sources'): AptSource[] {
  const out: AptSource[] = [];
  if (format === 'list') {
    for (const raw of text.split('\n')) {
      const line = raw.replace(/#.*$/, '').trim();
      const m = /^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$/.exec(line);
      if (!m) continue;
      const signed = /(?:^|\s)signed-by=(\S+)/.exec(m[1] ?? '');
      out.push({ uri: m[2], suite: m[3], components: m[4].split(/\s+/).filter(Boolean), ...(signed ? { signedBy: signed[1] } : {}) });
    }
    return out;
  }
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    let last: string | null = null;
    for (const raw of stanza.split('\n')) {
      if (raw.startsWith('#')) continue;
      const m = /^([A-Za-z-]+):\s*(.*)$/.exec(raw);
      if (m) {
        last = m[1].toLowerCase();
        fields.set(last, m[2].trim());
      } else if (last && /^\s/.test(raw)) {
        fields.set(last, `${fields.get(last)} ${raw.trim()}`);
      }
    }
    if (!(fields.get('types') ?? '').split(/\s+/).includes('deb')) continue;
    if (/^(no|false)$/i.test(fields.get('enabled') ?? 'yes')) continue;
    const signedBy = fields.get('signed-by');
    for (const uri of (fields.get('uris') ?? '').split(/\s+/).filter(Boolean)) {
      for (const suite of (fields.get('suites') ?? '').split(/\s+/).filter(Boolean)) {
        // An inline key (a PGP block) is not a path: such an entry is kept without it.
        out.push({ uri, suite, components: (fields.get('components') ?? '').split(/\s+/).filter(Boolean), ...(signedBy && signedBy.startsWith('/') && !signedBy.includes(' ') ? { signedBy } : {}) });
      }
    }
  }
  return out;
}

/** The entries of files and directories (their `*.list` and `*.sources`), those missing skipped. */
export function readAptSources(places: string[] = HOST_APT_SOURCES): AptSource[] {
  const files: string[] = [];
  for (const p of places) {
    let st: fs.Stats;
    try {
      st = fs.statSync(p);
    } catch {
      continue;
    }
    if (st.isDirectory()) {
      for (const f of fs.readdirSync(p).sort()) if (/\.(list|sources)$/.test(f)) files.push(path.join(p, f));
    } else files.push(p);
  }
  return files.flatMap((f) => parseAptSources(fs.readFileSync(f, 'utf8'), f.endsWith('.sources') ? 'sources' : 'list'));
}

/** The keyrings of Debian's own archive (in the base too, from debian-archive-keyring). */
const DEBIAN_KEYRING = /^\/usr\/share\/keyrings\/debian-archive-[a-z-]*keyring\.gpg$/;

/**
 * Whether an entry is a Debian archive (or a mirror of one): an http(s) URI without
 * credentials whose path ends in `/debian` or `/debian-security`, with the `main` component. A
 * third-party repository that names the suite too (Docker's `…/linux/debian bookworm stable`,
 * PostgreSQL's `bookworm-pgdg`) is not one.
 */
export function isDebianArchive(s: AptSource): boolean {
  let u: URL;
  try {
    u = new URL(s.uri);
  } catch {
    return false;
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return false;
  if (u.username || u.password) return false;
  return /\/debian(-security)?\/?$/.test(u.pathname) && s.components.includes('main');
}

/**
 * The Debian archive entries that serve `suite` and its companions (`<suite>-updates`,
 * `-security`, `-backports`), each keeping only `main` and the free components, and a
 * `signed-by` only when it is Debian's own keyring (a host path the base would not have is
 * dropped: the base's apt trusts Debian's keys anyway).
 */
export const sourcesForSuite = (all: AptSource[], suite: string): AptSource[] =>
  all
    .filter((s) => s.suite === suite || /^[a-z]+-(updates|security|backports)$/.test(s.suite) && s.suite.startsWith(`${suite}-`) || s.suite === `${suite}/updates`)
    .filter(isDebianArchive)
    .map((s) => ({
      uri: s.uri,
      suite: s.suite,
      components: s.components.filter((c) => ['main', 'contrib', 'non-free', 'non-free-firmware'].includes(c)),
      ...(s.signedBy && DEBIAN_KEYRING.test(s.signedBy) ? { signedBy: s.signedBy } : {}),
    }));

/** One-line form, as mmdebstrap takes a mirror argument and as the base's sources.list keeps it. */
export const sourceLine = (s: AptSource): string =>
  `deb ${s.signedBy ? `[signed-by=${s.signedBy}] ` : ''}${s.uri} ${s.suite} ${s.components.join(' ')}`.trim();

/** The hosts (and ports) the entries are fetched from: what a build's outbound rule opens. */
export function sourceEndpoints(sources: AptSource[]): { host: string; port: number }[] {
  const seen = new Map<string, { host: string; port: number }>();
  for (const s of sources) {
    let u: URL;
    try {
      u = new URL(s.uri);
    } catch {
      continue;
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') continue;
    const port = u.port ? Number(u.port) : u.protocol === 'https:' ? 443 : 80;
    seen.set(`${u.hostname}:${port}`, { host: u.hostname, port });
  }
  return [...seen.values()];
}
