/**
 * The scale run's fixed shape: how many boxes per batch, how many creates and deletes in flight,
 * how often the lists are walked, the box's size, the boxes per project, when creating stops and
 * the create figure's target. None of these is a knob (BENCH_SCALE_BOXES is, in bench/knobs.ts).
 */

export const BATCH = 100;
/**
 * 10 creates in flight: a little more than the worker's 8 job slots (BOXHOST_WORKER_CONCURRENCY's
 * default, left as shipped), so the node always has a job to start while the api answers the
 * last ones, yet few enough that a create's latency is its own work (plus at most a short wait
 * for a slot) rather than the length of a queue. What the hundreds are compared on is then how a
 * create's cost grows with the boxes already there. One at a time would leave the node mostly
 * idle and take far longer; 100 at once would measure queueing.
 */
export const CREATE_CONCURRENCY = 10;
/** Deletes in flight (issue 13's figure): what a person clearing a project would do. */
export const DELETE_CONCURRENCY = 20;
export const LIST_REPS = 20;
export const CLI_REPS = 5;
export const IDLE_SETTLE_MS = 10_000;
/** The smallest box the api takes (api/routes/boxes/schemas.ts: ram_mb ≥ 64). */
export const SMALL = { cpus: 1, ram_mb: 64, storage_gb: 1 };
/** Boxes per project at most (issue 13: 2 projects of 500). */
export const PER_PROJECT = 500;
/**
 * Creates that do not end running are counted and reported, not fatal: near the node's limits
 * some do (zfs-fuse mounts at most 1000 filesystems, machine-wide). A batch in which more than
 * this share fails ends the creating (the node takes no more); the rest is measured on the boxes
 * that run.
 */
export const STOP_FAILED_SHARE = 0.5;
/** The create's target: the last hundred's p50 at most this times the first hundred's. */
export const SCALE_TARGET = 1.2;
