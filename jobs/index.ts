import type { JobHandler } from './types';
import { createBoxJob } from './boxCreate';
import { stopBoxJob } from './boxStop';
import { resumeBoxJob } from './boxResume';
import { deleteBoxJob } from './boxDelete';

/** Every job handler a node's worker runs. */
export const jobHandlers: JobHandler[] = [createBoxJob, stopBoxJob, resumeBoxJob, deleteBoxJob];
