import type { Identity } from './context';
import { notFound } from '../core/errors';

export const canSeeProject = (identity: Identity, project: string) =>
  identity.projects === null || identity.projects.includes(project);

/** A token limited to other projects gets 404, as if the thing did not exist (DESIGN.md §4). */
export function assertProject(identity: Identity, project: string, what: string): void {
  if (!canSeeProject(identity, project)) throw notFound(what);
}
