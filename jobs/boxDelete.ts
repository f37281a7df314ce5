import { defineBoxTransition } from './boxTransition';

/** deleting → gone: container, network, datasets, then the row. */
export const deleteBoxJob = defineBoxTransition('delete', (node, box) => node.destroy(box));
