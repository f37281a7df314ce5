import { defineBoxTransition } from './boxTransition';

/** stopped → resuming → running, with the config as it is now (a PUT while stopped applies). */
export const resumeBoxJob = defineBoxTransition('resume', async (node, box) => void (await node.start(box)));
