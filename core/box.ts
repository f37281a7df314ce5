/**
 * The box state machine (DESIGN.md §3 "State values"): which action is allowed from which
 * status, what the box shows while the action runs, and where it ends. The api (checking a
 * request), the jobs (moving the box) and reconciliation (judging what it finds) all read it
 * from here, so there is one answer to "may this happen now?".
 */

/** Box `status` values. `unknown` is never stored: a read shows it while the box's node is
 *  not answering (DESIGN.md says nothing of lost nodes; docs/decisions.md "Nodes"). */
/** Where a box's agent is bound in (workers/runtime/ociSpec.ts binds its files there): no data
 *  mount may go there, and the files API does not change it. */
export const AGENT_DIR = '/.boxhost';

export type BoxStatus = 'creating' | 'running' | 'stopping' | 'stopped' | 'resuming' | 'restoring' | 'deleting' | 'failed';
export type ShownBoxStatus = BoxStatus | 'unknown';

/** Box statuses in which a box has (or is about to have) its data volumes mounted: a volume
 *  held by such a box is not restored or deleted under it (docs/data.md). */
export const VOLUME_HOLDING_STATUSES: ReadonlySet<string> = new Set(['creating', 'running', 'resuming', 'restoring', 'stopping', 'deleting']);

export const BOX_STATUSES: readonly ShownBoxStatus[] = ['creating', 'running', 'stopping', 'stopped', 'resuming', 'restoring', 'deleting', 'failed', 'unknown'];

/** The job-backed actions on one box. */
export type BoxAction = 'create' | 'stop' | 'resume' | 'restore' | 'delete';

export interface Transition {
  /** Statuses (as projected after the operations already queued) the action is allowed from. */
  from: readonly BoxStatus[];
  /** Shown while the action runs. */
  during: BoxStatus;
  /** Where a successful action leaves the box; `gone` removes it. */
  after: BoxStatus | 'gone';
}

export const TRANSITIONS: Record<BoxAction, Transition> = {
  create: { from: [], during: 'creating', after: 'running' },
  stop: { from: ['running'], during: 'stopping', after: 'stopped' },
  /** From `failed` too: a box whose start failed (a stop, resume, restore or recovery that did
   *  not end) is tried again with its config as it is now, as `lxc start` does; one that failed
   *  at create has no root, and the api refuses it (domain/boxes.ts). */
  resume: { from: ['stopped', 'failed'], during: 'resuming', after: 'running' },
  /** Back to a snapshot of its root: the container stops, the root rolls back, the box starts. */
  restore: { from: ['running', 'stopped'], during: 'restoring', after: 'running' },
  delete: { from: ['running', 'stopped', 'failed'], during: 'deleting', after: 'gone' },
};

/** Statuses that only an operation in flight may hold. */
export const TRANSITIONAL: ReadonlySet<BoxStatus> = new Set(['creating', 'stopping', 'resuming', 'restoring', 'deleting']);

/**
 * The status a box will have once the given unfinished actions have run, in order. After a
 * queued delete nothing else makes sense: it answers `deleting`, which every check refuses.
 */
export function projectedStatus(current: BoxStatus, pending: readonly BoxAction[]): BoxStatus {
  let status: BoxStatus | 'gone' = current;
  for (const a of pending) status = TRANSITIONS[a].after;
  return status === 'gone' ? 'deleting' : status;
}

/** The state words of a refusal: `running`, or `stopped, and will be deleted once the
 *  operations queued on it have run` when queued operations change it. */
export function describeState(current: BoxStatus, projected: BoxStatus): string {
  if (projected === current) return current;
  const will: Partial<Record<BoxStatus, string>> = { deleting: 'deleted', stopping: 'stopped', resuming: 'running', restoring: 'running', creating: 'running' };
  return `${current}, and will be ${will[projected] ?? projected} once the operations queued on it have run`;
}

/** Whether `action` may be queued behind `pending` on a box now `current`. */
export const allowed = (action: BoxAction, current: BoxStatus, pending: readonly BoxAction[]) =>
  TRANSITIONS[action].from.includes(projectedStatus(current, pending));

/** Exec and live limits need a box that runs now. */
export const canExec = (status: BoxStatus) => status === 'running';

/** A snapshot of the root needs a root that is not being made, rolled back or removed (a
 *  running box is paused for its instant). */
export const canSnapshot = (status: BoxStatus) => status === 'running' || status === 'stopped';

/** A fork clones a root that exists and is not being made or removed. */
export const canFork = (status: BoxStatus) => status === 'running' || status === 'stopped';

/** Tags, grace and limits can change on anything but a box on its way out. */
export const canUpdate = (status: BoxStatus) => status !== 'deleting';

/**
 * What reconciliation does with a box that has no operation in flight, given what the node's
 * runtime says of its container. The row is the truth: a box marked running whose container is
 * gone is started again; a stopped one whose container runs is stopped; a transitional status
 * with nothing behind it is an interrupted operation.
 */
export type Repair = 'none' | 'start' | 'stop' | 'fail-interrupted';
export function repairFor(status: BoxStatus, containerRunning: boolean): Repair {
  if (status === 'running' && !containerRunning) return 'start';
  if (status === 'stopped' && containerRunning) return 'stop';
  if (TRANSITIONAL.has(status)) return 'fail-interrupted';
  return 'none';
}

/**
 * The host ids a project's boxes run as (docs/security.md): every box runs in a user namespace
 * whose ids 0…65535 map to this range of unprivileged host ids, one range per project (so a
 * process that escapes one project's box is an unmapped stranger to every other project's
 * files). Ranges start at 1 000 000, as LXD's do, clear of the host's own users and of the
 * usual /etc/subuid ranges.
 */
export interface IdMap {
  /** First host id; box id 0 (root) is this host id. */
  hostId: number;
  size: number;
}
/** The longest grace between a stop's signal and its SIGKILL, for a box and for one of its
 *  services alike: a box stop holds a worker slot for it and a service stop holds its HTTP call
 *  (docs/decisions.md "Exec"). */
export const MAX_STOP_GRACE_SECS = 300;

/** An exec's timeout when none is asked (DESIGN.md §4). */
export const DEFAULT_EXEC_TIMEOUT_SECS = 300;
/** An exec holds a request, a process and its output buffers for as long as it runs: an hour is
 *  the most one call may ask for (docs/decisions.md "Exec"). */
export const MAX_EXEC_TIMEOUT_SECS = 3600;

export const ID_RANGE_BASE = 1_000_000;
export const ID_RANGE_SIZE = 65_536;
export const projectIdMap = (projectIndex: number): IdMap => ({ hostId: ID_RANGE_BASE + projectIndex * ID_RANGE_SIZE, size: ID_RANGE_SIZE });

/** A base version as stored: `busybox` + `3f2a…`. */
export interface BaseRef {
  name: string;
  version: string;
}

/** Where a new box root comes from. */
export type RootSource =
  | { kind: 'base'; base: BaseRef }
  /** A fork: the source box's root at `snapshot` (a box snapshot name) or, when absent, as it is now. */
  | { kind: 'box'; boxId: string; snapshot?: string };

/** The tag a base build's temporary box carries (its build id), for people listing boxes. */
export const BUILD_BOX_TAG = 'boxhost.build';
