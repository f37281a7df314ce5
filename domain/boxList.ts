import type { DomainContext, Identity } from './context';
import { boxesRepo, BoxRecord, ListCursor } from '../db/repos/boxes';
import { invalidField } from '../core/errors';
import type { BoxList } from '../core/apiTypes';
import { showBoxes } from './boxes';
import { assertProject } from './access';
import { DEFAULT_PAGE } from './paging';

/** Rows read per round while tag filters drop some. */
const SCAN_CHUNK = 500;

export interface ListBoxesQuery {
  prefix?: string;
  tag?: string;
  max_results?: number;
  continuation_token?: string;
}

const encodeCursor = (c: ListCursor) => Buffer.from(JSON.stringify([c.project, c.name])).toString('base64url');

function decodeCursor(token: string): ListCursor {
  try {
    const [project, name] = JSON.parse(Buffer.from(token, 'base64url').toString());
    if (typeof project === 'string' && typeof name === 'string') return { project, name };
  } catch {
    // fall through
  }
  throw invalidField('continuation_token', 'is not a token this api gave out');
}

/** `tag=a,b=1`: every listed tag must match (`k` present, or `k=v` equal). */
function tagMatcher(spec?: string) {
  if (!spec) return () => true;
  const wanted = spec.split(',').filter(Boolean).map((t) => {
    const i = t.indexOf('=');
    return i < 0 ? { key: t, value: undefined } : { key: t.slice(0, i), value: t.slice(i + 1) };
  });
  return (b: BoxRecord) => wanted.every(({ key, value }) => Object.hasOwn(b.tags, key) && (value === undefined || b.tags[key] === value));
}

/**
 * A page of boxes in (project, name) order. The continuation token is the last key returned,
 * so pages stay stable while boxes are added or removed elsewhere in the order.
 */
export async function listBoxes(ctx: DomainContext, identity: Identity, project: string, q: ListBoxesQuery): Promise<BoxList> {
  const limit = q.max_results || DEFAULT_PAGE;
  let projects: string[] | null;
  if (project === '-') projects = identity.projects;
  else {
    // A project-limited token gets 404 for a project it may not see (DESIGN.md §6).
    assertProject(identity, project, `project ${project}`);
    projects = [project];
  }
  const matches = tagMatcher(q.tag);
  let after = q.continuation_token ? decodeCursor(q.continuation_token) : undefined;
  const found: BoxRecord[] = [];
  if (projects === null || projects.length > 0) {
    // One extra match tells whether another page exists.
    while (found.length <= limit) {
      const chunk = await boxesRepo.page(ctx.db, { projects, prefix: q.prefix, after, limit: SCAN_CHUNK });
      for (const b of chunk) if (matches(b)) found.push(b);
      if (chunk.length < SCAN_CHUNK) break;
      after = chunk[chunk.length - 1];
    }
  }
  const page = found.slice(0, limit);
  const hasMore = found.length > limit;
  const last = page[page.length - 1];
  return {
    boxes: await showBoxes(ctx, page),
    has_more: hasMore,
    next_continuation_token: hasMore ? encodeCursor(last) : null,
  };
}
