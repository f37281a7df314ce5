import { defineBoxTransition } from './boxTransition';

/** stopped → resuming → running, with the config as it is now (a PUT while stopped applies). */
export const resumeBoxJob = defineBoxTransition('resume', (node, box) => node.start(box));
