import Joi from 'joi';
import { defineRoute } from '../../http/route';
import { name } from '../../http/schemas';
import { operationHeaders } from '../../http/operation';
import { createSnapshot } from '../../../domain/snapshots';
import type { CreateBoxSnapshotRequest } from '../../../core/apiTypes';
import { boxParams, BoxParams, boxSchema } from '../boxes/schemas';
import { MAX_DESCRIPTION_CHARS, snapshotErrors, snapshotSchema } from './schemas';

export default defineRoute<CreateBoxSnapshotRequest, unknown, BoxParams>({
  method: 'post',
  path: '/v1/projects/{project}/boxes/{name}/snapshots',
  summary: "Snapshot a box's root (a running box is paused for the instant of it); answers the snapshot, or 202 + operation past 30 s",
  tag: 'snapshots',
  params: boxParams,
  body: Joi.object({
    name: name().required(),
    description: Joi.string().allow('').max(MAX_DESCRIPTION_CHARS).pattern(/^[^\x00-\x1f\x7f]*$/).messages({ 'string.pattern.base': 'must be one line without control characters' }),
  }),
  responses: {
    201: { description: 'taken', schema: snapshotSchema },
    202: { description: 'still being taken after 30 s: poll Location or GET /v1/operations/{Operation-Id}', schema: boxSchema },
    400: { description: 'a bad name or description' },
    409: { description: 'the name is taken; the box is not running or stopped; it has its most snapshots (BOXHOST_SNAPSHOTS_MAX_PER_BOX, default 100)' },
    ...snapshotErrors,
  },
  handler: async ({ api, identity, params, body }) => {
    const taken = await createSnapshot(api, identity, params.project, params.name, body);
    if ('snapshot' in taken) return { status: 201, body: taken.snapshot };
    return { status: 202, body: (await taken.accepted.load()) ?? undefined, headers: operationHeaders(taken.accepted.operation) };
  },
});
