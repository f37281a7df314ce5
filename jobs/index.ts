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
import { recipeBaseJob } from './baseRecipe';
import { createDataJob, deleteDataJob, deleteDataSnapshotJob, snapshotDataJob } from './dataVolume';
import { backupDataJob } from './dataBackup';
import { restoreDataJob } from './dataRestore';
import { packServicesJob } from './packServices';
import { packDeployJob, packRetireJob } from './packDeploy';

/** Every job handler a node's worker runs. */
export const jobHandlers: JobHandler[] = [createBoxJob, stopBoxJob, resumeBoxJob, restoreBoxJob, snapshotBoxJob, deleteBoxJob, saveBaseJob, importBaseJob, buildBaseJob, recipeBaseJob,
  createDataJob, deleteDataJob, snapshotDataJob, deleteDataSnapshotJob, backupDataJob, restoreDataJob, packServicesJob, packDeployJob, packRetireJob];
