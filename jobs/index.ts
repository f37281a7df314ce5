import type { JobKind } from './types';
import { createBoxJob } from './boxCreate';
import { stopBoxJob } from './boxStop';
import { resumeBoxJob } from './boxResume';
import { deleteBoxJob } from './boxDelete';

/** Every job kind the worker runs. */
export const jobKinds: JobKind[] = [createBoxJob, stopBoxJob, resumeBoxJob, deleteBoxJob];
