import type { JobKind } from './types';

/** Every job kind the worker runs. */
export const jobKinds: JobKind[] = [];
