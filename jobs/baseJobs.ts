import Joi from 'joi';
import { NAME_PATTERN } from '../core/names';
import { jobType } from './types';

/** Base versions are 12 hex (a content hash or a random id): docs/bases.md "Versions". */
export const BASE_VERSION_PATTERN = /^[0-9a-f]{12}$/;

export interface BaseRefPayload {
  name: string;
  version: string;
}

export interface BaseSavePayload extends BaseRefPayload {
  boxId: string;
}

export interface BaseImportPayload extends BaseRefPayload {
  /** The upload staged on the job's node (`LocalNode.stageBaseImport`). */
  token: string;
}

export interface BaseBuildPayload extends BaseRefPayload {
  buildId: string;
  /** The temporary box the script runs in (its create runs first, in turn). */
  boxId: string;
}

const ref = { name: Joi.string().pattern(NAME_PATTERN).required(), version: Joi.string().pattern(BASE_VERSION_PATTERN).required() };

export const baseJobs = {
  save: jobType<BaseSavePayload>('base.save', Joi.object<BaseSavePayload>({ ...ref, boxId: Joi.string().pattern(/^[a-z0-9]{1,32}$/).required() })),
  build: jobType<BaseBuildPayload>('base.build', Joi.object<BaseBuildPayload>({ ...ref, buildId: Joi.string().pattern(/^bb_[a-z0-9]{20}$/).required(), boxId: Joi.string().pattern(/^[a-z0-9]{1,32}$/).required() })),
  /** A recipe base (`debian`) made on the job's node unless it is there (jobs/baseRecipe.ts). */
  recipe: jobType<BaseRefPayload>('base.recipe', Joi.object<BaseRefPayload>(ref)),
  import: jobType<BaseImportPayload>('base.import', Joi.object<BaseImportPayload>({ ...ref, token: Joi.string().pattern(/^[0-9a-f]{32}$/).required() })),
} as const;
