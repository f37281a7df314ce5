import { defineBoxTransition } from './boxTransition';

/** running → stopping → stopped: SIGTERM, SIGKILL after the grace period; the root is kept. */
export const stopBoxJob = defineBoxTransition('stop', (node, box) => node.stop(box));
