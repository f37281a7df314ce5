import { boxesRepo } from '../db/repos/boxes';
import { operationsRepo } from '../db/repos/operations';
import { newId, now } from '../core/ids';
import { publicReason } from '../jobs/publicReason';
import type { WorkerContext } from './context';

export interface AgentWatchdogOptions {
  ctx: WorkerContext;
  /** How often the node's running boxes are looked at. */
  intervalMs: number;
  /** How long a box's boxd has to answer a hello. */
  timeoutMs: number;
  /** Looks in a row without an answer before the box is restarted (default 3). */
  misses?: number;
  /** True while the node is busy with something that stops boxes itself (storage recovery):
   *  no look then. */
  paused?: () => boolean;
}

export interface AgentWatchdog {
  /** Boxes restarted so far (box ids, in order; a box may appear more than once). */
  readonly restarted: readonly string[];
  stop(): Promise<void>;
}

/** Boxes looked at at once. */
const PARALLEL = 8;

/**
 * Keeps every box the db says is running served by its agent (docs/boxd.md "Recovery"): a box
 * whose container is gone (its boxd, PID 1, died) is started again, and one whose boxd no
 * longer answers a hello (`misses` looks in a row) is stopped and started again, which gives it a new boxd and brings its
 * enabled services back. A box with an operation queued or running is left to it, and a restart
 * is an operation of its own that takes its turn with the others (see `restart`).
 */
export function startAgentWatchdog(opts: AgentWatchdogOptions): AgentWatchdog {
  const { ctx } = opts;
  const log = ctx.log.child({ part: 'agent-watchdog' });
  const need = opts.misses ?? 3;
  const misses = new Map<string, number>();
  const restarted: string[] = [];
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let wake: (() => void) | undefined;

  const idle = async (boxId: string) => {
    const row = await boxesRepo.byId(ctx.db, boxId);
    if (!row || row.status !== 'running' || row.node !== ctx.config.nodeId) return null;
    return (await operationsRepo.unfinishedForBox(ctx.db, boxId)).length === 0 ? row : null;
  };

  /**
   * Restarts the box as an operation of its own (`box.recover`), so it takes its turn with the
   * box's other operations: its row is written first, and the restart goes on only if no
   * operation came before it; one that comes after waits for it (workers/worker.ts) and sees the
   * box as the restart left it. The stop is the box's own (boxd asked, then SIGKILL after the
   * grace: a wedged PID 1 cannot refuse it).
   */
  const restart = async (boxId: string, why: string) => {
    const row = await idle(boxId);
    if (!row || stopped || opts.paused?.()) return;
    const op = newId('op');
    const at = now();
    await operationsRepo.insert(ctx.db, {
      id: op, kind: 'box.recover', status: 'running', resource: `/v1/projects/${row.project}/boxes/${row.name}`, box_id: row.id, project: row.project,
      node: ctx.config.nodeId, progress: null, error: null, payload: JSON.stringify({ boxId: row.id, why }), created_by: null, created_at: at, updated_at: at,
    });
    const mine = await operationsRepo.get(ctx.db, op);
    if (!mine || (await operationsRepo.earlierUnfinished(ctx.db, row.id, mine.seq)) || (await boxesRepo.byId(ctx.db, row.id))?.status !== 'running') {
      await operationsRepo.remove(ctx.db, op); // another operation got there first: it decides
      return;
    }
    log.warn({ boxId, why, operation: op }, 'restarting a box whose agent is gone or does not answer');
    try {
      await ctx.boxes.stop(row);
      await ctx.boxes.start(row);
      restarted.push(boxId);
      await operationsRepo.update(ctx.db, op, { status: 'succeeded', progress: 100 });
    } catch (e) {
      log.error({ boxId, err: (e as Error).message }, 'restarting the box failed; the next look tries again');
      await operationsRepo.update(ctx.db, op, { status: 'failed', error: publicReason(e) });
    }
  };

  /**
   * The hello first: a boxd that answers is the PID 1 of a running container, so a healthy box
   * costs a connect and one frame. Asking runc first cost a `runc state` (≈25 ms of a process)
   * per box per look: at 400 boxes that was most of the growth of create times with the box
   * count (bench scale: `runtime.status` 10 → 107 ms per create from the first hundred to the
   * fourth). The container's state is asked only when boxd does not answer.
   */
  const look = async (boxId: string) => {
    const health = await ctx.runtime.probeAgent(boxId, opts.timeoutMs);
    if (health === 'ok') {
      misses.delete(boxId);
      return;
    }
    const status = await ctx.runtime.status(boxId);
    if (status !== 'running') {
      misses.delete(boxId);
      // Looked again after a moment: a box between a job's stop and its row's update is not lost.
      if (await idle(boxId)) await restart(boxId, `its container is ${status ?? 'gone'}`);
      return;
    }
    if (health === 'unknown') return; // the node could not tell: neither a miss nor an answer
    if (health !== 'unresponsive') {
      misses.delete(boxId);
      return;
    }
    const n = (misses.get(boxId) ?? 0) + 1;
    misses.set(boxId, n);
    log.warn({ boxId, misses: n }, 'boxd did not answer');
    if (n >= need) {
      misses.delete(boxId);
      await restart(boxId, `boxd did not answer ${n} looks in a row`);
    }
  };

  const round = async () => {
    if (opts.paused?.()) return;
    const boxes = (await boxesRepo.onNode(ctx.db, ctx.config.nodeId)).filter((b) => b.status === 'running');
    for (const id of [...misses.keys()]) if (!boxes.some((b) => b.id === id)) misses.delete(id);
    for (let i = 0; i < boxes.length && !stopped; i += PARALLEL) {
      await Promise.all(
        boxes.slice(i, i + PARALLEL).map(async (b) => {
          if ((await operationsRepo.unfinishedForBox(ctx.db, b.id)).length > 0) return;
          await look(b.id).catch((e) => log.warn({ boxId: b.id, err: (e as Error).message }, 'looking at a box failed'));
        }),
      );
    }
  };

  const loop = (async () => {
    while (!stopped) {
      await new Promise<void>((resolve) => {
        wake = resolve;
        timer = setTimeout(resolve, opts.intervalMs);
        timer.unref();
      });
      if (stopped) break;
      await round().catch((e) => log.warn({ err: (e as Error).message }, 'an agent watchdog round failed'));
    }
  })();

  return {
    restarted,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      wake?.();
      await loop;
    },
  };
}
