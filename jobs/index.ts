import type { JobHandler } from './types';
import { createBoxJob } from './boxCreate';
import { stopBoxJob } from './boxStop';
import { resumeBoxJob } from './boxResume';
import { deleteBoxJob } from './boxDelete';
import { restoreBoxJob } from './boxRestore';
import { snapshotBoxJob } from './boxSnapshot';
import { saveBaseJob } from './baseSave';
import { importBaseJob } from './baseImport';
import { buildBaseJob } from './baseBuild';
import { createDataJob, deleteDataJob, deleteDataSnapshotJob, snapshotDataJob } from './dataVolume';
import { backupDataJob } from './dataBackup';
import { restoreDataJob } from './dataRestore';

/** Every job handler a node's worker runs. */
export const jobHandlers: JobHandler[] = [createBoxJob, stopBoxJob, resumeBoxJob, restoreBoxJob, snapshotBoxJob, deleteBoxJob, saveBaseJob, importBaseJob, buildBaseJob,
  createDataJob, deleteDataJob, snapshotDataJob, deleteDataSnapshotJob, backupDataJob, restoreDataJob];
