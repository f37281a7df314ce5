import { defineBoxTransition } from './boxTransition';
import { JobRefused } from './types';
import type { BoxResumePayload } from './boxJobs';

/** Whether this resume starts a box that failed (asked of a failed box, or one that failed while
 *  the resume waited its turn). */
const fromFailed = (status: string, payload: BoxResumePayload) => status === 'failed' || payload.from === 'failed';

/**
 * stopped → resuming → running, with the config as it is now (a PUT while stopped applies).
 * From `failed` too (docs/decisions.md "Boxes"): the container, which a stop or start that
 * failed may have left running, is stopped first, so the box starts afresh with its config and
 * mounts of now; a box whose root is gone (its create failed for good) is refused, left failed
 * with its own error.
 */
export const resumeBoxJob = defineBoxTransition<BoxResumePayload>(
  'resume',
  async (node, box, payload) => {
    if (fromFailed(box.status, payload)) await node.stop(box);
    await node.start(box);
  },
  async (node, box, payload) => {
    if (fromFailed(box.status, payload) && !(await node.hasRoot(box))) {
      throw new JobRefused(`box has nothing to start: its root is gone${box.error ? ` (${box.error})` : ''}; delete it and create it again`, 'failed');
    }
  },
);
